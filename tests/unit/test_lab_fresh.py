"""The fresh-install lab server's recipe and client files: its rootfs as a minimal install leaves
a server (no python3-apt, nothing masked, no /etc/hosts), cached apart from the lab's own, and
an inventory whose known_hosts has never seen the server."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from provisioner.lab import LabError, rootfs, server, ssh, state


def test_the_fresh_rootfs_lacks_what_the_product_installs_and_masks_nothing(tmp_path: Path) -> None:
    fresh = rootfs.mmdebstrap_cmd(tmp_path / "f.tar.zst", [Path("/etc/apt/sources.list")], [], rootfs.FRESH)
    include = fresh[2].removeprefix("--include=").split(",")
    assert "python3-apt" not in include and "lsb-release" not in include
    for needed in ("python3", "openssh-server", "systemd-sysv", "dbus", "iproute2", "procps", "ca-certificates"):
        assert needed in include
    hooks = [a.removeprefix("--customize-hook=") for a in fresh if a.startswith("--customize-hook=")]
    assert any("ssh_host_" in h for h in hooks), "servers would share one host key"
    assert any("/etc/hosts" in h for h in hooks)
    assert not any("/dev/null" in h for h in hooks), "a fresh install masks no unit"
    lab = rootfs.mmdebstrap_cmd(tmp_path / "l.tar.zst", [Path("/etc/apt/sources.list")], [])
    assert "python3-apt" in lab[2], "the lab's own rootfs keeps python3-apt"


def test_the_two_rootfs_are_cached_under_different_names() -> None:
    sources = ["deb a bookworm main\n"]
    assert rootfs.rootfs_key(sources, []) == rootfs.rootfs_key(sources, [], rootfs.LAB), "the lab's key is as before"
    assert rootfs.rootfs_key(sources, [], rootfs.FRESH) != rootfs.rootfs_key(sources, [])
    assert rootfs.flavour(True).prefix == "bookworm-fresh" and rootfs.flavour(False).prefix == "bookworm"


def test_a_fresh_servers_inventory_trusts_no_key_and_leaves_checking_to_ansible(tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    ssh.write_client_files(tmp_path, "fr-unit", "10.213.6.2", key, ["ssh-ed25519", "AAAAC3Nza"], fresh=True)
    known = tmp_path / "known_hosts"
    assert known.read_text() == "", "the inventory's known_hosts must start empty"
    host = yaml.safe_load((tmp_path / "inventory.yml").read_text())["all"]["children"]["lab"]["hosts"]["fr-unit"]
    args = host["ansible_ssh_common_args"]
    assert f"-o UserKnownHostsFile={known}" in args and "StrictHostKeyChecking" not in args
    # The lab's own way in (ssh -F) checks the key it made, in a file the inventory never names.
    config = (tmp_path / "ssh_config").read_text().splitlines()
    assert f"  UserKnownHostsFile {tmp_path / ssh.LAB_KNOWN_HOSTS}" in config and "  StrictHostKeyChecking yes" in config
    assert (tmp_path / ssh.LAB_KNOWN_HOSTS).read_text() == "10.213.6.2 ssh-ed25519 AAAAC3Nza\n"


def test_a_fresh_overlay_gets_no_etc_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ssh, "_host_key", lambda merged, name: ["ssh-ed25519", "AAAAC3Nza"])
    for fresh in (True, False):
        merged = tmp_path / str(fresh)
        (merged / "etc").mkdir(parents=True)
        ssh.prepare_overlay(merged, "fr-unit", "ssh-ed25519 AAAA lab\n", fresh=fresh)
        assert (merged / "etc" / "hostname").read_text() == "fr-unit\n"
        assert (merged / "etc" / "hosts").exists() is not fresh


def test_the_state_remembers_a_fresh_server() -> None:
    made = state.LabServer.from_dict({"name": "fr-unit", "fresh": True})
    assert made.fresh and made.to_dict()["fresh"] is True
    assert not state.LabServer.from_dict({"name": "pv-unit"}).fresh, "servers recorded before stay lab servers"


def running(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **fields: object) -> state.LabServer:
    """A server fr-unit that up() finds running, with FIELDS in its state."""
    found = state.LabServer.from_dict({"name": "fr-unit", "alive": True, **fields})
    monkeypatch.setenv("PROVISIONER_LAB_DIR", str(tmp_path))
    monkeypatch.setattr(server, "check_environment", lambda: None)
    monkeypatch.setattr(server, "ensure_rootfs", lambda fresh=False: tmp_path)
    monkeypatch.setattr(server, "read_state", lambda name: {})
    monkeypatch.setattr(server, "server_from_state", lambda data: found)
    return found


def test_up_refuses_to_turn_a_running_server_into_the_other_flavour(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    running_server = running(monkeypatch, tmp_path, fresh=False)
    with pytest.raises(LabError, match=r"runs as a lab server, not a fresh one: take it down first \(lab down fr-unit\)"):
        server.up("fr-unit", fresh=True)
    assert server.up("fr-unit") is running_server


def test_up_refuses_a_running_server_of_another_cpu_weight(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    running_server = running(monkeypatch, tmp_path, cpu_weight=1000)
    with pytest.raises(LabError, match=r"runs with CPU weight 1000, not none: take it down first \(lab down fr-unit\)"):
        server.up("fr-unit")
    with pytest.raises(LabError, match=r"runs with CPU weight 1000, not CPU weight 200"):
        server.up("fr-unit", cpu_weight=200)
    assert server.up("fr-unit", cpu_weight=1000) is running_server
