"""Reaching a lab server over ssh: the lab key pair, each server's own host key and identity
inside its overlay, and the files a client uses (known_hosts, inventory.yml, ssh_config)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from provisioner import paths
from provisioner.system import run

from .common import LabError, write_file


def lab_key() -> Path:
    """The lab key pair (one per lab dir, generated once)."""
    key = paths.lab_dir() / "id_ed25519"
    if not key.is_file():
        key.parent.mkdir(parents=True, exist_ok=True)
        key.with_name(key.name + ".pub").unlink(missing_ok=True)
        run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "provisioner-lab", "-f", str(key)],
            "generating the lab ssh key failed",
            error=LabError,
        )
    return key


def _host_key(merged: Path, name: str) -> list[str]:
    """A fresh ed25519 sshd host key inside the overlay; returns [type, base64]."""
    ssh_dir = merged / "etc" / "ssh"
    for old in ssh_dir.glob("ssh_host_*"):
        old.unlink()
    key = ssh_dir / "ssh_host_ed25519_key"
    run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(key)],
        f"generating the host key for {name} failed",
        error=LabError,
    )
    write_file(
        ssh_dir / "sshd_config.d" / "provisioner-lab.conf",
        "# written by provisioner lab: only this server's own host key\nHostKey /etc/ssh/ssh_host_ed25519_key\n",
    )
    return key.with_name(key.name + ".pub").read_text().split()[:2]


def _replace_file(path: Path, text: str, mode: int = 0o644) -> None:
    """Write a file in the overlay, replacing a symlink if there is one."""
    if path.is_symlink():
        path.unlink()
    write_file(path, text, mode)


def _enable_sshd(merged: Path) -> None:
    wants = merged / "etc" / "systemd" / "system" / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / "ssh.service"
    if not link.is_symlink():
        link.symlink_to("/lib/systemd/system/ssh.service")


def prepare_overlay(merged: Path, name: str, lab_pub: str, fresh: bool = False) -> list[str]:
    """Hostname, host key, root's authorized key, resolv.conf, sshd enabled; returns the host key.

    FRESH (a server as a minimal install leaves it): no /etc/hosts is written either.
    """
    _replace_file(merged / "etc" / "hostname", f"{name}\n")
    if not fresh:
        hosts = merged / "etc" / "hosts"
        base = hosts.read_text() if hosts.is_file() else "127.0.0.1\tlocalhost\n"
        _replace_file(hosts, base.rstrip("\n") + f"\n127.0.1.1\t{name}\n")
    host_key = _host_key(merged, name)
    ssh_root = merged / "root" / ".ssh"
    ssh_root.mkdir(mode=0o700, parents=True, exist_ok=True)
    ssh_root.chmod(0o700)
    write_file(ssh_root / "authorized_keys", lab_pub, 0o600)
    _replace_file(merged / "etc" / "resolv.conf", Path("/etc/resolv.conf").read_text())
    _enable_sshd(merged)
    return host_key


# Under software emulation an ssh login takes seconds: Ansible's 10 s connect timeout is too short.
VM_SSH_TIMEOUT_S = 60


def inventory(name: str, address: str, key: Path, known_hosts: Path, port: int = 22, fresh: bool = False) -> dict[str, Any]:
    """An Ansible inventory with the one server in group `lab`, its host key checked strictly.

    FRESH: host key checking as a user's inventory leaves it (no StrictHostKeyChecking of its
    own: Ansible's default, on), against a known_hosts that has never seen the server.
    """
    strict = "" if fresh else " -o StrictHostKeyChecking=yes"
    ssh_opts = f"-o UserKnownHostsFile={known_hosts}{strict} -o ControlMaster=no -o ControlPath=none"
    host: dict[str, Any] = {
        "ansible_host": address,
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(key),
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_ssh_common_args": ssh_opts,
    }
    if port != 22:
        # Said explicitly: a host at 127.0.0.1 without a connection type counts as this machine
        # (never rebooted), while a lab VM there is reached over ssh and may be rebooted.
        host["ansible_connection"] = "ssh"
        host["ansible_port"] = port
        host["ansible_timeout"] = VM_SSH_TIMEOUT_S
    return {"all": {"children": {"lab": {"hosts": {name: host}}}}}


def ssh_config(name: str, address: str, key: Path, known_hosts: Path, port: int = 22) -> str:
    """An ssh_config stanza for `ssh -F FILE NAME`: root with the lab key, strict host key, no prompts.

    Every ssh is a login of its own, as to a real server: a connection kept between commands
    would give each later command the environment of its first login (PAM reads /etc/environment
    and the limits when a connection logs in), and a VM's would hang on a guest a reboot took away."""
    return (
        f"Host {name}\n"
        f"  HostName {address}\n"
        + (f"  Port {port}\n  ConnectTimeout {VM_SSH_TIMEOUT_S}\n" if port != 22 else "")
        + "  User root\n"
        f"  IdentityFile {key}\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known_hosts}\n"
        "  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n"
        "  ControlMaster no\n"
        "  ControlPath none\n"
        "  BatchMode yes\n"
        "  LogLevel ERROR\n"
    )


# A fresh server's host key as the lab recorded it: for ssh_config (the lab's and the tests'
# own way in), never for the inventory, whose known_hosts starts empty.
LAB_KNOWN_HOSTS = "lab_known_hosts"


def write_client_files(
    root: Path, name: str, address: str, key: Path, host_key: list[str], port: int = 22, fresh: bool = False
) -> None:
    """ROOT/known_hosts, ROOT/inventory.yml and ROOT/ssh_config for server NAME (sshd on PORT).

    FRESH: ROOT/known_hosts is empty (the inventory's, as on a control node that never saw the
    server) and the key goes to ROOT/lab_known_hosts, which only ssh_config reads.
    """
    known_hosts = root / "known_hosts"
    host = address if port == 22 else f"[{address}]:{port}"
    record = f"{host} {host_key[0]} {host_key[1]}\n"
    write_file(known_hosts, "" if fresh else record)
    trusted = known_hosts
    if fresh:
        trusted = root / LAB_KNOWN_HOSTS
        write_file(trusted, record)
    inv = inventory(name, address, key, known_hosts, port, fresh)
    write_file(root / "inventory.yml", yaml.safe_dump(inv, sort_keys=False))
    write_file(root / "ssh_config", ssh_config(name, address, key, trusted, port))


def new_host_key(directory: Path, name: str) -> list[str]:
    """A fresh ed25519 host key in DIRECTORY (handed to a VM at boot); returns [type, base64]."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = directory / "ssh_host_ed25519_key"
    for old in directory.glob("ssh_host_ed25519_key*"):
        old.unlink()
    run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(key)],
        f"generating the host key for {name} failed",
        error=LabError,
    )
    return key.with_name(key.name + ".pub").read_text().split()[:2]
