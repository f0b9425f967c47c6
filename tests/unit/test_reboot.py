from provisioner.reboot import REASONS_FACT, decide, is_local

FACTS = {
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
    assert is_local("localhost", {})
    assert is_local("box", {"ansible_connection": "local"})
    assert is_local("box", {"ansible_host": "127.0.0.1"})
    assert not is_local("localhost", {"ansible_connection": "ssh", "ansible_host": "10.0.0.5"})
    assert not is_local("web", {"ansible_host": "203.0.113.5"})
