"""provisioner.lab, the parts that decide without booting anything: names, subnets, the NAT
rule, the state files and their listing, the nspawn, mmdebstrap and mount command lines,
the client files, and what the machine must have."""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path

import pytest
import yaml

from provisioner import lab
from provisioner.errors import ProvisionerError
from provisioner.lab import common, mounts, network, processes, rootfs, server, ssh, state


@pytest.fixture
def lab_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "lab"
    monkeypatch.setenv("PROVISIONER_LAB_DIR", str(path))
    return path


# What the CLI, the tests, the molecule driver and the benchmarks use of provisioner.lab.
CALLERS_USE = "LabError LabServer NAT_COMMENT down ensure_rootfs frozen list_servers missing_requirement missing_vm_requirement set_drive up up_vm"


def test_the_package_offers_what_callers_use() -> None:
    assert sorted(lab.__all__) == sorted(CALLERS_USE.split())
    assert all(callable(getattr(lab, name)) for name in lab.__all__ if name != "NAT_COMMENT")
    assert issubclass(lab.LabError, ProvisionerError)  # the CLI turns it into one line and an exit code


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["a", "pv-test", "x1-2", "a" * 31])
def test_good_names_pass(name: str) -> None:
    state.validate_name(name)


@pytest.mark.parametrize("name", ["", "Upper", "1abc", "a_b", "a.b", "a" * 32, "-x", "a b", "a/b", "a\n"])
def test_bad_names_are_refused_with_the_rule(name: str) -> None:
    with pytest.raises(lab.LabError, match=r"bad lab server name .*1-31 characters, a-z, 0-9 and '-'"):
        state.validate_name(name)


@pytest.mark.parametrize("call", [server.up, server.down])
def test_up_and_down_refuse_a_bad_name_before_anything_else(call, monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_run() -> None:
        raise AssertionError("the environment was checked before the name")

    monkeypatch.setattr(server, "check_environment", must_not_run)
    with pytest.raises(lab.LabError, match="bad lab server name"):
        call("../etc")


# --------------------------------------------------------------------------- network


def test_subnets_are_one_slash24_each_inside_the_lab_net() -> None:
    assert network.subnet(1) == ("10.213.1.1", "10.213.1.2")
    assert network.subnet(254) == ("10.213.254.1", "10.213.254.2")
    for index in (1, 77, 254):
        host, srv = (ipaddress.IPv4Address(a) for a in network.subnet(index))
        assert host in network.LAB_NET and srv in network.LAB_NET
        assert ipaddress.IPv4Network(f"{host}/24", strict=False) == ipaddress.IPv4Network(f"{srv}/24", strict=False)


IP_ADDR = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
2: eth0    inet 10.0.2.15/24 brd 10.0.2.255 scope global eth0\\       valid_lft forever
7: ve-pv-test    inet 10.213.1.1/24 scope global ve-pv-test\\       valid_lft forever
9: ve-other    inet 10.213.12.1/24 scope global ve-other\\       valid_lft forever
11: br0    inet 10.2130.5.1/24 scope global br0
"""


def test_lab_subnets_are_read_from_ip_addr_output() -> None:
    assert network.lab_indexes(IP_ADDR) == {1, 12}
    assert network.lab_indexes("") == set()


def test_the_lowest_free_subnet_is_taken() -> None:
    assert network.free_index([]) == 1
    assert network.free_index({1, 2, 4}) == 3
    assert network.free_index(range(1, 254)) == 254


def test_no_free_subnet_names_the_fix() -> None:
    with pytest.raises(lab.LabError, match=r"all 254 lab subnets are in use: take some lab servers down"):
        network.free_index(range(1, 255))


def test_allocation_skips_subnets_on_the_host_and_in_states(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(network, "host_lab_indexes", lambda: {1, 3})
    states = [{"name": "a", "address": "10.213.2.2"}, {"name": "half-made"}, {"name": "b", "address": "10.213.x.2"}]
    assert network.allocate_index(states) == 4


def test_the_nat_rule_masquerades_only_traffic_leaving_the_lab_net() -> None:
    rule = network.nat_rule()
    assert rule[0] == "POSTROUTING" and rule[-2:] == ["-j", "MASQUERADE"]
    assert rule[rule.index("-s") + 1] == "10.213.0.0/16"
    assert rule[rule.index("-d") - 1 : rule.index("-d") + 2] == ["!", "-d", "10.213.0.0/16"]
    assert rule[rule.index("--comment") + 1] == lab.NAT_COMMENT == "provisioner-lab"


# --------------------------------------------------------------------------- state


def _server(root: Path) -> lab.LabServer:
    return lab.LabServer(
        name="pv-unit",
        address="10.213.5.2",
        pid=1234,
        leader_pid=1240,
        root=root,
        ssh_key=root.parent / "id_ed25519",
        known_hosts=root / "known_hosts",
        inventory=root / "inventory.yml",
        ssh_config=root / "ssh_config",
        host_veth="ve-pv-unit",
        devices=["/dev/loop3"],
        alive=True,
    )


def test_a_server_round_trips_through_its_state_file(lab_dir: Path) -> None:
    srv = _server(lab_dir / "pv-unit")
    state.write_state("pv-unit", srv.to_dict(), indent=2)
    path = lab_dir / "pv-unit" / "state.json"
    data = json.loads(path.read_text())
    assert data["root"] == str(lab_dir / "pv-unit") and data["devices"] == ["/dev/loop3"]
    # Paths written as strings; None only where a server has no such thing (no CPU weight).
    assert all(isinstance(v, (str, int, bool, list, type(None))) for v in data.values())
    assert data["cpu_weight"] is None
    assert path.read_text().startswith("{\n  ")  # the final state is indented
    assert lab.LabServer.from_dict(state.read_state("pv-unit")) == srv
    assert not list(path.parent.glob("*.tmp"))


def test_a_half_made_state_gets_the_default_paths(lab_dir: Path) -> None:
    srv = lab.LabServer.from_dict({"name": "pv-half", "address": "10.213.9.2", "unknown": 1})
    root = lab_dir / "pv-half"
    assert (srv.root, srv.ssh_key, srv.known_hosts, srv.inventory, srv.ssh_config) == (
        root,
        lab_dir / "id_ed25519",
        root / "known_hosts",
        root / "inventory.yml",
        root / "ssh_config",
    )
    assert (srv.pid, srv.leader_pid, srv.host_veth, srv.devices, srv.alive) == (0, 0, "", [], False)


def test_a_state_without_a_name_or_with_a_bad_path_is_no_server(lab_dir: Path) -> None:
    assert state.server_from_state({}) is None
    assert state.server_from_state({"name": "x", "root": None}) is None


def test_listing_reads_every_server_dir_with_a_state(lab_dir: Path) -> None:
    state.write_state("b-srv", {"name": "b-srv", "address": "10.213.2.2", "pid": 0})
    state.write_state("a-srv", {"name": "a-srv", "address": "10.213.1.2"})
    (lab_dir / "no-state").mkdir()
    (lab_dir / "broken").mkdir()
    (lab_dir / "broken" / "state.json").write_text("{not json")
    (lab_dir / "id_ed25519").write_text("key")
    servers = lab.list_servers()
    assert [s.name for s in servers] == ["a-srv", "b-srv"]
    assert not any(s.alive for s in servers)
    assert state.read_state("broken") == {} and state.read_state("missing") == {}


def test_no_lab_dir_lists_nothing(lab_dir: Path) -> None:
    assert lab.list_servers() == [] and state.all_states() == []


def test_tearing_down_what_does_not_exist_is_harmless(lab_dir: Path) -> None:
    assert server._teardown("pv-none") is False


def test_the_lab_lock_lives_in_the_lab_dir(lab_dir: Path) -> None:
    with lab.frozen():
        assert (lab_dir / ".lock").is_file()


# --------------------------------------------------------------------------- processes


def test_nspawn_boots_the_overlay_with_its_own_veth_and_the_devices_bound(tmp_path: Path) -> None:
    cmd = processes.nspawn_cmd(tmp_path / "merged", "pv-unit", ["/dev/loop3", "/dev/loop4"])
    assert cmd[:3] == ["systemd-nspawn", "-D", str(tmp_path / "merged")]
    for flag in ("--boot", "--register=no", "--keep-unit", "--network-veth", "--machine=pv-unit", "--console=read-only"):
        assert flag in cmd
    assert cmd[-2:] == ["--bind=/dev/loop3", "--bind=/dev/loop4"]
    assert not any(a.startswith("--bind") for a in processes.nspawn_cmd(tmp_path, "pv-unit", []))


def test_an_nspawn_is_recognised_by_program_and_machine_name() -> None:
    argv = [b"/usr/bin/systemd-nspawn", b"-D", b"/x", b"--machine=pv-unit", b""]
    assert processes.is_nspawn_argv(argv, "pv-unit")
    assert not processes.is_nspawn_argv(argv, "pv-unit2")
    assert not processes.is_nspawn_argv([b"/usr/bin/sleep", b"--machine=pv-unit"], "pv-unit")
    assert not processes.is_nspawn_argv([], "pv-unit")


def test_no_process_and_a_non_nspawn_process_are_not_ours() -> None:
    assert not processes.is_our_nspawn(0, "pv-unit")
    assert not processes.is_our_nspawn(-5, "pv-unit")
    assert not processes.is_our_nspawn(os.getpid(), "pv-unit")
    assert processes.proc_state(os.getpid()) in ("R", "S")
    assert processes.proc_state(2**22 + 1) is None


# --------------------------------------------------------------------------- mounts


def test_mountinfo_escapes_are_decoded() -> None:
    text = (
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "98 22 0:50 / /var/lib/provisioner/lab/my\\040dir/merged rw - overlay overlay rw,lowerdir=/x\n"
    )
    assert mounts.parse_mountinfo(text) == {"/", "/var/lib/provisioner/lab/my dir/merged"}


def test_the_overlay_sits_on_the_rootfs() -> None:
    assert mounts.overlay_options(Path("/c/bookworm-k"), Path("/l/n/upper"), Path("/l/n/work")) == (
        "lowerdir=/c/bookworm-k,upperdir=/l/n/upper,workdir=/l/n/work"
    )


def test_devices_must_be_absolute_paths_that_exist(tmp_path: Path) -> None:
    dev = tmp_path / "disk"
    dev.touch()
    assert mounts.check_devices((str(dev),)) == [str(dev)]
    for bad in ("loop3", str(tmp_path / "missing")):
        with pytest.raises(lab.LabError, match=r"does not exist: pass an absolute path"):
            mounts.check_devices([bad])


# --------------------------------------------------------------------------- rootfs


@pytest.fixture
def host_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "apt.conf.d").mkdir()
    monkeypatch.setattr(rootfs, "HOST_SOURCES_LIST", apt / "sources.list")
    monkeypatch.setattr(rootfs, "HOST_SOURCES_DIR", apt / "sources.list.d")
    monkeypatch.setattr(rootfs, "HOST_APT_CONF_DIR", apt / "apt.conf.d")
    return apt


def test_the_host_sources_naming_bookworm_are_the_mirrors(host_apt: Path) -> None:
    (host_apt / "sources.list").write_text("# deb http://deb.debian.org/debian bookworm main\n")
    (host_apt / "sources.list.d" / "debian.sources").write_text("Types: deb\nSuites: bookworm bookworm-updates\n")
    (host_apt / "sources.list.d" / "other.list").write_text("deb http://example.org/ trixie main\n")
    (host_apt / "sources.list.d" / "bookworm.txt").write_text("deb http://example.org/ bookworm main\n")
    assert rootfs.host_sources() == [host_apt / "sources.list.d" / "debian.sources"]


def test_no_bookworm_source_names_the_fix(host_apt: Path) -> None:
    with pytest.raises(lab.LabError, match=r"no apt source for bookworm .*reuses the host's Debian 12 apt sources, add one"):
        rootfs.host_sources()


def test_only_acquire_settings_without_hooks_are_passed_on(host_apt: Path) -> None:
    conf = host_apt / "apt.conf.d"
    (conf / "01proxy").write_text('Acquire::http::Proxy "http://proxy:3128";\n')
    (conf / "02hook").write_text('Acquire::x "1";\nDPkg::Post-Invoke { "true"; };\n')
    (conf / "03other").write_text('APT::Install-Recommends "0";\n')
    (conf / "04dir").mkdir()
    assert rootfs.host_acquire_confs() == [conf / "01proxy"]


def test_the_rootfs_key_follows_the_host_sources_and_options() -> None:
    key = rootfs.rootfs_key(["deb a bookworm main\n"], [])
    assert len(key) == 16 and int(key, 16) >= 0
    assert rootfs.rootfs_key(["deb a bookworm main\n"], []) == key
    assert rootfs.rootfs_key(["deb b bookworm main\n"], []) != key
    assert rootfs.rootfs_key(["deb a bookworm main\n"], ['Acquire::x "1";']) != key


def test_mmdebstrap_gets_options_then_suite_target_and_mirrors(tmp_path: Path) -> None:
    cmd = rootfs.mmdebstrap_cmd(tmp_path / "out.tar.zst", [Path("/etc/apt/sources.list")], [Path("/etc/apt/apt.conf.d/01proxy")])
    assert cmd[:3] == ["mmdebstrap", "--variant=minbase", "--include=" + ",".join(rootfs.INCLUDE)]
    assert "--aptopt=/etc/apt/apt.conf.d/01proxy" in cmd
    assert [a for a in cmd if a.startswith("--customize-hook=")] == [f"--customize-hook={h}" for h in rootfs.CUSTOMIZE_HOOKS]
    assert cmd[-3:] == ["bookworm", str(tmp_path / "out.tar.zst"), "/etc/apt/sources.list"]
    assert any("ssh_host_" in h for h in rootfs.CUSTOMIZE_HOOKS), "servers would share one host key"


# --------------------------------------------------------------------------- ssh


def test_client_files_check_the_one_host_key_strictly(tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    ssh.write_client_files(tmp_path, "pv-unit", "10.213.5.2", key, ["ssh-ed25519", "AAAAC3Nza"])
    known = tmp_path / "known_hosts"
    assert known.read_text() == "10.213.5.2 ssh-ed25519 AAAAC3Nza\n"
    host = yaml.safe_load((tmp_path / "inventory.yml").read_text())["all"]["children"]["lab"]["hosts"]["pv-unit"]
    assert host["ansible_host"] == "10.213.5.2" and host["ansible_user"] == "root"
    assert host["ansible_ssh_private_key_file"] == str(key)
    assert f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes" in host["ansible_ssh_common_args"]
    config = (tmp_path / "ssh_config").read_text().splitlines()
    assert config[0] == "Host pv-unit"
    for line in (
        "  HostName 10.213.5.2",
        f"  IdentityFile {key}",
        f"  UserKnownHostsFile {known}",
        "  StrictHostKeyChecking yes",
    ):
        assert line in config
    assert "  GlobalKnownHostsFile /dev/null" in config and "  BatchMode yes" in config
    # Every ssh logs in anew, as to a real server: a kept connection would carry its first login's
    # environment (PAM's /etc/environment) to every later command.
    assert "  ControlMaster no" in config and "  ControlPath none" in config


# --------------------------------------------------------------------------- this machine


def test_lab_servers_need_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert lab.missing_requirement() == "lab servers need root (overlay mounts, systemd-nspawn): run as root"
    with pytest.raises(lab.LabError, match="need root"):
        common.check_environment()


def test_missing_tools_are_named_with_the_packages_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(common.shutil, "which", lambda tool: None if tool in ("mmdebstrap", "zstd") else f"/usr/bin/{tool}")
    assert lab.missing_requirement() == (
        "lab servers need mmdebstrap, zstd: apt-get install systemd-container mmdebstrap iptables iproute2 openssh-client zstd"
    )
    monkeypatch.setattr(common.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    assert lab.missing_requirement() is None


def test_files_are_written_whole_with_their_mode(tmp_path: Path) -> None:
    target = tmp_path / "new" / "authorized_keys"
    common.write_file(target, "ssh-ed25519 AAAA\n", 0o600)
    assert target.read_text() == "ssh-ed25519 AAAA\n" and target.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["authorized_keys"]
