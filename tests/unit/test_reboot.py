from provisioner.reboot import REASONS_FACT, decide, is_local

FACTS: dict[str, dict[str, list[str]]] = {
    "train-01": {REASONS_FACT: ["hugepages: 1G pages are reserved at boot", "hugepages: 1G pages are reserved at boot"]},
    "train-02": {REASONS_FACT: []},
    "localhost": {REASONS_FACT: ["hugepages: 1G pages are reserved at boot"]},
}
HOSTVARS = {"train-01": {"ansible_host": "203.0.113.11"}, "train-02": {}, "localhost": {"ansible_connection": "local"}}


def test_nothing_is_rebooted_without_consent():
    d = decide(FACTS, HOSTVARS, allow_reboot=False)
    assert d.reboot == {}
    assert set(d.pending) == {"train-01", "localhost"}


def test_consent_reboots_remote_hosts_once_never_this_machine():
    d = decide(FACTS, HOSTVARS, allow_reboot=True)
    assert d.reboot == {"train-01": ["hugepages: 1G pages are reserved at boot"]}
    assert d.pending == {"localhost": ["hugepages: 1G pages are reserved at boot"]}


def test_local_detection():
    assert is_local("box", {"ansible_connection": "local"})
    assert is_local("box", {"ansible_connection": "ansible.builtin.local", "ansible_host": "203.0.113.5"})
    assert not is_local("localhost", {"ansible_connection": "ssh", "ansible_host": "10.0.0.5"})
    assert not is_local("web", {"ansible_host": "203.0.113.5"})


def test_a_host_forwarded_through_a_loopback_port_is_another_machine():
    """Ansible reaches 127.0.0.1 with a port and no connection over ssh: a tunnel or a forwarded
    port (the lab's VMs), another machine, which --reboot reboots."""
    forwarded = {"ansible_host": "127.0.0.1", "ansible_port": 2222}
    assert not is_local("vm-1", forwarded)
    assert not is_local("vm-1", {"ansible_host": "::1", "ansible_port": "10022"})
    assert not is_local("vm-1", {"ansible_ssh_host": "127.0.0.1", "ansible_ssh_port": 2201})
    d = decide({"vm-1": {REASONS_FACT: ["hugepages: 1G pages are reserved at boot"]}}, {"vm-1": forwarded}, True)
    assert d.reboot == {"vm-1": ["hugepages: 1G pages are reserved at boot"]} and d.pending == {}


def test_ssh_to_this_machines_own_sshd_is_this_machine():
    """ssh to a loopback address on ssh's port logs into the machine provisioner runs on: never rebooted."""
    assert is_local("box", {"ansible_host": "127.0.0.1"})
    assert is_local("box", {"ansible_host": "127.0.0.2", "ansible_port": 22})
    assert is_local("box", {"ansible_host": "localhost", "ansible_connection": "ssh"})
    # localhost in the inventory without a connection: Ansible uses ssh, to this machine's sshd
    assert is_local("localhost", {})
    assert not is_local("localhost", {"ansible_port": 2222})


def test_implicit_localhost_is_local_and_other_transports_are_not():
    # A host named localhost that the inventory does not hold: Ansible's implicit localhost (local).
    assert is_local("localhost", {}, in_inventory=False)
    assert is_local("127.0.0.1", {}, in_inventory=False)
    assert not is_local("web", {}, in_inventory=False)
    d = decide({"localhost": {REASONS_FACT: ["r"]}}, {}, allow_reboot=True)
    assert d.pending == {"localhost": ["r"]} and d.reboot == {}
    # A container's connection at a loopback address is not this machine's sshd.
    assert not is_local("c1", {"ansible_connection": "community.docker.docker", "ansible_host": "127.0.0.1"})
