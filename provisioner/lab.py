"""Disposable Debian 12 "lab servers" on this machine: systemd-nspawn over an overlay.

A lab server is a booted Debian 12 (systemd as PID 1, sshd listening) in its own
network namespace, reachable from the host at 10.213.N.2 with the lab's ssh key and a
strict, per-server known_hosts file. Its root filesystem is an overlay over one
read-only rootfs built once with mmdebstrap, so creating one takes about a second and
throwing it away discards every change.

Layout:
    cache_dir()/bookworm-KEY.tar.zst   the mmdebstrap tarball (KEY hashes the recipe)
    cache_dir()/bookworm-KEY/          the extracted rootfs (overlay lowerdir, never written)
    lab_dir()/id_ed25519[.pub]         the lab key pair (root login on every server)
    lab_dir()/ip_forward.saved         host's net.ipv4.ip_forward before the first server
    lab_dir()/NAME/                    upper/ work/ merged/ state.json console.log
                                       known_hosts inventory.yml ssh_config

Everything needs root, systemd-nspawn, mmdebstrap, iptables, iproute2 and openssh.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from provisioner import paths
from provisioner.errors import ProvisionerError

SUITE = "bookworm"
VARIANT = "minbase"
INCLUDE: tuple[str, ...] = (
    "python3",
    "python3-apt",
    "openssh-server",
    "systemd-sysv",
    "dbus",
    "iproute2",
    "procps",
    "ca-certificates",
)
# Host keys made by openssh-server's postinst would be shared by every server: drop them,
# each server gets its own at `up`.
CUSTOMIZE_HOOKS: tuple[str, ...] = (
    'rm -f "$1"/etc/ssh/ssh_host_*',
    # apt's daily timers would take the dpkg lock at random moments after boot: a role's apt
    # task then waits for it and can report a change where there was none.
    'ln -sf /dev/null "$1"/etc/systemd/system/apt-daily.timer',
    'ln -sf /dev/null "$1"/etc/systemd/system/apt-daily-upgrade.timer',
)

NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
LAB_NET = ipaddress.IPv4Network("10.213.0.0/16")
NAT_COMMENT = "provisioner-lab"
SSH_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
START_TIMEOUT_S = 10.0  # nspawn to leader and host0 visible

HOST_SOURCES_LIST = Path("/etc/apt/sources.list")
HOST_SOURCES_DIR = Path("/etc/apt/sources.list.d")
HOST_APT_CONF_DIR = Path("/etc/apt/apt.conf.d")

REQUIRED_TOOLS = (
    "systemd-nspawn",
    "mmdebstrap",
    "nsenter",
    "ip",
    "iptables",
    "ssh-keygen",
    "mount",
    "umount",
    "tar",
    "zstd",
    "ssh",
)


class LabError(ProvisionerError):
    """A lab server could not be built, started, reached or torn down."""


@dataclass
class LabServer:
    name: str
    address: str
    pid: int
    leader_pid: int
    root: Path
    ssh_key: Path
    known_hosts: Path
    inventory: Path
    ssh_config: Path
    host_veth: str
    devices: list[str] = field(default_factory=list)
    alive: bool = False

    def to_dict(self) -> dict:
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, Path):
                data[key] = str(value)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> LabServer:
        path_keys = ("root", "ssh_key", "known_hosts", "inventory", "ssh_config")
        values = {k: (Path(v) if k in path_keys else v) for k, v in data.items()}
        values["devices"] = list(values.get("devices") or [])
        # A half-made server (up failed or was killed) lacks some fields.
        root = Path(values.get("root") or paths.lab_dir() / values["name"])
        values.setdefault("root", root)
        values.setdefault("address", "")
        values.setdefault("pid", 0)
        values.setdefault("leader_pid", 0)
        values.setdefault("host_veth", "")
        values.setdefault("ssh_key", paths.lab_dir() / "id_ed25519")
        values.setdefault("known_hosts", root / "known_hosts")
        values.setdefault("inventory", root / "inventory.yml")
        values.setdefault("ssh_config", root / "ssh_config")
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in values.items() if k in known})


# --------------------------------------------------------------------------- helpers


def _run(cmd: Sequence[str], what: str, fix: str = "", **kwargs) -> subprocess.CompletedProcess:
    """Run a command without stdin; raise LabError naming `what` (and `fix`) on failure."""
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    kwargs.setdefault("capture_output", "stdout" not in kwargs and "stderr" not in kwargs)
    try:
        proc = subprocess.run(list(cmd), text=True, check=False, **kwargs)
    except OSError as exc:
        raise LabError(f"{what}: cannot run {cmd[0]} ({exc}); {fix or 'install it'}") from exc
    if proc.returncode != 0:
        detail = _last_line(proc.stderr) or _last_line(proc.stdout) or f"exit {proc.returncode}"
        raise LabError(f"{what}: {detail}" + (f"; {fix}" if fix else ""))
    return proc


def _last_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


@contextlib.contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
    """An exclusive fcntl lock held for the duration of the block."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _validate_name(name: str) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise LabError(f"bad lab server name {name!r}: use 1-31 characters, a-z, 0-9 and '-', starting with a letter")


def missing_requirement() -> str | None:
    """What this machine lacks for lab servers (one line naming the fix), or None."""
    if os.geteuid() != 0:
        return "lab servers need root (overlay mounts, systemd-nspawn): run as root"
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        return (
            f"lab servers need {', '.join(missing)}: apt-get install systemd-container "
            "mmdebstrap iptables iproute2 openssh-client zstd"
        )
    return None


def _check_environment() -> None:
    problem = missing_requirement()
    if problem:
        raise LabError(problem)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- rootfs


def _host_sources() -> list[Path]:
    """The host's apt sources files for SUITE (passed to mmdebstrap as its mirrors)."""
    candidates = [HOST_SOURCES_LIST] if HOST_SOURCES_LIST.is_file() else []
    if HOST_SOURCES_DIR.is_dir():
        candidates += sorted(p for p in HOST_SOURCES_DIR.iterdir() if p.suffix in (".list", ".sources"))
    chosen = [p for p in candidates if re.search(rf"(?m)^[^#]*\b{SUITE}\b", p.read_text())]
    if not chosen:
        raise LabError(
            f"no apt source for {SUITE} in {HOST_SOURCES_LIST} or {HOST_SOURCES_DIR}: "
            "the lab reuses the host's Debian 12 apt sources, add one"
        )
    return chosen


def _host_acquire_confs() -> list[Path]:
    """Host apt.conf.d files with Acquire settings (proxy, Check-Valid-Until, ...).

    Files with hook commands (*-Invoke) are left out: they call host programs.
    """
    if not HOST_APT_CONF_DIR.is_dir():
        return []
    chosen = []
    for path in sorted(HOST_APT_CONF_DIR.iterdir()):
        text = path.read_text(errors="replace") if path.is_file() else ""
        if "Acquire" in text and "Invoke" not in text:
            chosen.append(path)
    return chosen


def _rootfs_key() -> str:
    """Hash of everything that decides the rootfs content."""
    recipe = {
        "suite": SUITE,
        "variant": VARIANT,
        "include": sorted(INCLUDE),
        "hooks": list(CUSTOMIZE_HOOKS),
        "sources": [p.read_text() for p in _host_sources()],
        "aptopts": [p.read_text() for p in _host_acquire_confs()],
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def _mmdebstrap_cmd(target: Path) -> list[str]:
    cmd = ["mmdebstrap", f"--variant={VARIANT}", f"--include={','.join(INCLUDE)}"]
    cmd += [f"--aptopt={p}" for p in _host_acquire_confs()]
    cmd += [f"--customize-hook={hook}" for hook in CUSTOMIZE_HOOKS]
    return cmd + [SUITE, str(target)] + [str(p) for p in _host_sources()]


def _build_tarball(tarball: Path) -> None:
    """mmdebstrap into a temporary name, then rename atomically."""
    partial = tarball.with_name(f".partial-{os.getpid()}-{tarball.name}")
    log = tarball.with_name(tarball.name.removesuffix(".tar.zst") + ".build.log")
    try:
        with open(log, "w") as out:
            _run(
                _mmdebstrap_cmd(partial),
                "building the lab rootfs with mmdebstrap failed",
                f"see {log}",
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        os.replace(partial, tarball)
    finally:
        partial.unlink(missing_ok=True)


def _extract(tarball: Path, rootfs: Path) -> None:
    """Extract into a temporary dir, then rename atomically."""
    partial = rootfs.with_name(f".partial-{os.getpid()}-{rootfs.name}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(mode=0o755)
    try:
        _run(
            [
                "tar",
                "--zstd",
                "-xpf",
                str(tarball),
                "-C",
                str(partial),
                "--numeric-owner",
                "--xattrs",
                "--xattrs-include=*",
            ],
            f"extracting {tarball} failed",
            "delete it and retry",
        )
        os.replace(partial, rootfs)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def ensure_rootfs() -> Path:
    """The extracted, read-only lab rootfs; built and extracted once, then cached."""
    _check_environment()
    cache = paths.cache_dir()
    key = _rootfs_key()
    tarball = cache / f"{SUITE}-{key}.tar.zst"
    rootfs = cache / f"{SUITE}-{key}"
    if rootfs.is_dir():
        return rootfs
    with _locked(cache / ".rootfs.lock"):
        if not tarball.is_file():
            _build_tarball(tarball)
        if not rootfs.is_dir():
            _extract(tarball, rootfs)
    return rootfs


# --------------------------------------------------------------------------- processes


def _proc_state(pid: int) -> str | None:
    """Process state letter from /proc/PID/stat, None if no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


# systemd-nspawn processes started by this process, to collect their exit status.
_CHILDREN: dict[int, subprocess.Popen] = {}


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our own child (no zombie left)."""
    proc = _CHILDREN.get(pid)
    if proc is not None and proc.poll() is not None:
        del _CHILDREN[pid]


def _is_our_nspawn(pid: int, name: str) -> bool:
    """True if PID is a running (not zombie) systemd-nspawn for machine NAME."""
    if pid <= 0:
        return False
    _reap(pid)
    if _proc_state(pid) in (None, "Z", "X"):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(argv) and os.path.basename(argv[0]) == b"systemd-nspawn" and f"--machine={name}".encode() in argv


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def _ns(pid: int, kind: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return ""


def _wait_leader(pid: int, console: Path) -> int:
    """The container's PID 1: the nspawn child living in its own pid and net namespaces."""
    own_pid_ns, own_net_ns = _ns(os.getpid(), "pid"), _ns(os.getpid(), "net")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for child in _children(pid):
            pid_ns, net_ns = _ns(child, "pid"), _ns(child, "net")
            if pid_ns and net_ns and pid_ns != own_pid_ns and net_ns != own_net_ns:
                return child
        if _proc_state(pid) in (None, "Z"):
            raise LabError(f"systemd-nspawn exited at start: see {console}")
        time.sleep(0.02)
    raise LabError(f"systemd-nspawn started no container in {START_TIMEOUT_S:.0f} s: see {console}")


def _signal(pid: int, sig: int, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _wait_gone(pid: int, name: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _is_our_nspawn(pid, name):
            return True
        time.sleep(0.05)
    return not _is_our_nspawn(pid, name)


def _stop(pid: int, leader_pid: int, name: str, graceful: bool = True) -> None:
    """SIGTERM nspawn (systemd halts), after STOP_TIMEOUT_S SIGKILL its process group.

    SIGTERM is repeated every second: nspawn turns it into SIGRTMIN+3 for the
    container's systemd, which is lost if systemd has not set up its handlers yet.
    """
    if not _is_our_nspawn(pid, name):
        return
    if graceful:
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            _signal(pid, signal.SIGTERM)
            if _wait_gone(pid, name, min(1.0, max(0.0, deadline - time.monotonic()))):
                return
    _signal(pid, signal.SIGKILL, group=True)
    if leader_pid > 0 and _proc_state(leader_pid) not in (None, "Z"):
        _signal(leader_pid, signal.SIGKILL)
    if not _wait_gone(pid, name, 5.0):
        raise LabError(f"systemd-nspawn PID {pid} for lab server {name} survived SIGKILL: kill it by hand")


# --------------------------------------------------------------------------- mounts


def _mount_points() -> set[str]:
    points = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        raw = line.split()[4]
        points.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), raw))
    return points


def _is_mounted(path: Path) -> bool:
    return str(path) in _mount_points()


def _mount_overlay(rootfs: Path, root: Path) -> Path:
    upper, work, merged = root / "upper", root / "work", root / "merged"
    for d in (upper, work, merged):
        d.mkdir(parents=True, exist_ok=True)
    upper.chmod(0o755)  # becomes the server's "/" (independent of our umask)
    options = f"lowerdir={rootfs},upperdir={upper},workdir={work}"
    _run(
        ["mount", "-t", "overlay", "overlay", "-o", options, str(merged)],
        f"overlay mount at {merged} failed",
        "check that the kernel has overlayfs and the lab dir is not on overlayfs itself",
    )
    return merged


def _umount(merged: Path) -> None:
    """Unmount, retrying while busy, then lazily."""
    for _ in range(10):
        if not _is_mounted(merged):
            return
        if subprocess.run(["umount", str(merged)], capture_output=True).returncode == 0:
            return
        time.sleep(0.2)
    if _is_mounted(merged):
        _run(["umount", "-l", str(merged)], f"cannot unmount {merged}", "unmount it by hand")


# --------------------------------------------------------------------------- keys, files


def _lab_key() -> Path:
    """The lab key pair (one per lab dir, generated once)."""
    key = paths.lab_dir() / "id_ed25519"
    if not key.is_file():
        key.parent.mkdir(parents=True, exist_ok=True)
        key.with_name(key.name + ".pub").unlink(missing_ok=True)
        _run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "provisioner-lab",
                "-f",
                str(key),
            ],
            "generating the lab ssh key failed",
        )
    return key


def _host_key(merged: Path, name: str) -> list[str]:
    """A fresh ed25519 sshd host key inside the overlay; returns [type, base64]."""
    ssh_dir = merged / "etc" / "ssh"
    for old in ssh_dir.glob("ssh_host_*"):
        old.unlink()
    key = ssh_dir / "ssh_host_ed25519_key"
    _run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(key)],
        f"generating the host key for {name} failed",
    )
    _write(
        ssh_dir / "sshd_config.d" / "provisioner-lab.conf",
        "# written by provisioner lab: only this server's own host key\nHostKey /etc/ssh/ssh_host_ed25519_key\n",
    )
    return key.with_name(key.name + ".pub").read_text().split()[:2]


def _replace_file(path: Path, text: str, mode: int = 0o644) -> None:
    """Write a file in the overlay, replacing a symlink if there is one."""
    if path.is_symlink():
        path.unlink()
    _write(path, text, mode)


def _prepare_overlay(merged: Path, name: str, lab_pub: str) -> list[str]:
    """Hostname, host key, root's authorized key, resolv.conf, sshd enabled."""
    _replace_file(merged / "etc" / "hostname", f"{name}\n")
    hosts = merged / "etc" / "hosts"
    base = hosts.read_text() if hosts.is_file() else "127.0.0.1\tlocalhost\n"
    _replace_file(hosts, base.rstrip("\n") + f"\n127.0.1.1\t{name}\n")
    host_key = _host_key(merged, name)
    ssh_root = merged / "root" / ".ssh"
    ssh_root.mkdir(mode=0o700, parents=True, exist_ok=True)
    ssh_root.chmod(0o700)
    _write(ssh_root / "authorized_keys", lab_pub, 0o600)
    _replace_file(merged / "etc" / "resolv.conf", Path("/etc/resolv.conf").read_text())
    _enable_sshd(merged)
    return host_key


def _enable_sshd(merged: Path) -> None:
    wants = merged / "etc" / "systemd" / "system" / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / "ssh.service"
    if not link.is_symlink():
        link.symlink_to("/lib/systemd/system/ssh.service")


def _write_client_files(root: Path, name: str, address: str, key: Path, host_key: list[str]) -> None:
    known_hosts = root / "known_hosts"
    _write(known_hosts, f"{address} {host_key[0]} {host_key[1]}\n")
    ssh_opts = f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes -o ControlMaster=no -o ControlPath=none"
    inventory = {
        "all": {
            "children": {
                "lab": {
                    "hosts": {
                        name: {
                            "ansible_host": address,
                            "ansible_user": "root",
                            "ansible_ssh_private_key_file": str(key),
                            "ansible_python_interpreter": "/usr/bin/python3",
                            "ansible_ssh_common_args": ssh_opts,
                        }
                    }
                }
            }
        }
    }
    _write(root / "inventory.yml", yaml.safe_dump(inventory, sort_keys=False))
    _write(
        root / "ssh_config",
        f"Host {name}\n"
        f"  HostName {address}\n"
        "  User root\n"
        f"  IdentityFile {key}\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known_hosts}\n"
        "  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n"
        "  ControlMaster no\n"
        "  ControlPath none\n"
        "  BatchMode yes\n"
        "  LogLevel ERROR\n",
    )


# --------------------------------------------------------------------------- network


def _subnet(index: int) -> tuple[str, str]:
    """(host side, server side) addresses of lab subnet INDEX."""
    base = int(LAB_NET.network_address) + (index << 8)
    return str(ipaddress.IPv4Address(base + 1)), str(ipaddress.IPv4Address(base + 2))


def _host_lab_indexes() -> set[int]:
    """Lab subnets in use on this host's interfaces (any lab dir)."""
    out = _run(["ip", "-o", "-4", "addr", "show"], "listing host addresses failed").stdout
    used = set()
    for match in re.finditer(r"inet (10\.213\.(\d+)\.\d+)/", out):
        used.add(int(match.group(2)))
    return used


def _allocate_index() -> int:
    used = _host_lab_indexes()
    for state in _all_states():
        with contextlib.suppress(KeyError, ValueError):
            used.add(int(state["address"].split(".")[2]))
    for index in range(1, 255):
        if index not in used:
            return index
    raise LabError("all 254 lab subnets are in use: take some lab servers down (provisioner lab down NAME)")


def _peer_veth(leader_pid: int, console: Path) -> str:
    """Host-side veth name: host0's peer ifindex, read inside the server's netns."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        proc = subprocess.run(
            ["nsenter", "-t", str(leader_pid), "-n", "ip", "-o", "link", "show", "dev", "host0"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
        match = re.search(r"host0@if(\d+)", proc.stdout)
        if match:
            with contextlib.suppress(OSError):
                return socket.if_indextoname(int(match.group(1)))
        time.sleep(0.02)
    raise LabError(f"no host0 veth in the lab server after {START_TIMEOUT_S:.0f} s: see {console}")


def _address_veth(leader_pid: int, veth: str, host_ip: str, server_ip: str) -> None:
    what = "addressing the lab veth failed"
    _run(["ip", "addr", "add", f"{host_ip}/24", "dev", veth], what)
    _run(["ip", "link", "set", veth, "up"], what)
    inside = ["nsenter", "-t", str(leader_pid), "-n", "ip"]
    _run([*inside, "link", "set", "lo", "up"], what)
    _run([*inside, "addr", "add", f"{server_ip}/24", "dev", "host0"], what)
    _run([*inside, "link", "set", "host0", "up"], what)
    _run([*inside, "route", "replace", "default", "via", host_ip], what)


def _nat_rule() -> list[str]:
    return [
        "POSTROUTING",
        "-s",
        str(LAB_NET),
        "!",
        "-d",
        str(LAB_NET),
        "-m",
        "comment",
        "--comment",
        NAT_COMMENT,
        "-j",
        "MASQUERADE",
    ]


def _nat_present() -> bool:
    cmd = ["iptables", "-w", "-t", "nat", "-C", *_nat_rule()]
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True).returncode == 0


def _enable_host_network() -> None:
    """ip_forward on (previous value remembered) and the one MASQUERADE rule."""
    saved = paths.lab_dir() / "ip_forward.saved"
    forward = Path("/proc/sys/net/ipv4/ip_forward")
    if not saved.is_file():
        _write(saved, forward.read_text())
    forward.write_text("1\n")
    if not _nat_present():
        _run(
            ["iptables", "-w", "-t", "nat", "-A", *_nat_rule()],
            "adding the lab NAT rule failed",
            "check that iptables works here",
        )


def _release_host_network_if_idle() -> None:
    """With no lab subnet left on this host: NAT rule out, ip_forward restored."""
    if _host_lab_indexes():
        return
    while _nat_present():
        _run(["iptables", "-w", "-t", "nat", "-D", *_nat_rule()], "removing the lab NAT rule failed")
    saved = paths.lab_dir() / "ip_forward.saved"
    if saved.is_file():
        Path("/proc/sys/net/ipv4/ip_forward").write_text(saved.read_text())
        saved.unlink()


def _delete_link(veth: str) -> None:
    """The veth goes with the netns; delete a leftover (kernel cleanup is asynchronous)."""
    if veth and Path(f"/sys/class/net/{veth}").exists():
        subprocess.run(["ip", "link", "del", veth], stdin=subprocess.DEVNULL, capture_output=True)


# --------------------------------------------------------------------------- state


def _state_file(name: str) -> Path:
    return paths.lab_dir() / name / "state.json"


def _read_state(name: str) -> dict:
    try:
        return json.loads(_state_file(name).read_text())
    except (OSError, ValueError):
        return {}


def _all_states() -> list[dict]:
    lab = paths.lab_dir()
    if not lab.is_dir():
        return []
    return [s for d in sorted(lab.iterdir()) if d.is_dir() and (s := _read_state(d.name))]


def _server_from_state(state: dict) -> LabServer | None:
    try:
        server = LabServer.from_dict(state)
    except (TypeError, KeyError):
        return None
    server.alive = _is_our_nspawn(server.pid, server.name)
    return server


# --------------------------------------------------------------------------- up / down


def _spawn(merged: Path, name: str, devices: Sequence[str], console: Path) -> int:
    cmd = [
        "systemd-nspawn",
        "-D",
        str(merged),
        "--boot",
        "--register=no",
        "--keep-unit",
        "--network-veth",
        f"--machine={name}",
        "--console=read-only",
    ]
    cmd += [f"--bind={dev}" for dev in devices]
    with open(console, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    _CHILDREN[proc.pid] = proc
    return proc.pid


def _wait_ssh(address: str, pid: int, name: str, console: Path) -> None:
    """Until sshd sends its banner on port 22, at most SSH_TIMEOUT_S."""
    deadline = time.monotonic() + SSH_TIMEOUT_S
    while time.monotonic() < deadline:
        if not _is_our_nspawn(pid, name):
            raise LabError(f"lab server {name} stopped while booting: see {console}")
        with contextlib.suppress(OSError), socket.create_connection((address, 22), timeout=1.0) as sock:
            sock.settimeout(2.0)
            if sock.recv(64).startswith(b"SSH-"):
                return
        time.sleep(0.1)
    raise LabError(f"sshd in lab server {name} did not answer on {address}:22 in {SSH_TIMEOUT_S:.0f} s: see {console}")


def _check_devices(devices: Sequence[str]) -> list[str]:
    for dev in devices:
        if not dev.startswith("/") or not os.path.exists(dev):
            raise LabError(
                f"device {dev!r} for the lab server does not exist: pass an absolute path (e.g. from losetup -f --show)"
            )
    return list(devices)


def _create(name: str, devices: list[str], rootfs: Path) -> LabServer:
    root = paths.lab_dir() / name
    root.mkdir(parents=True)
    root.chmod(0o700)
    key = _lab_key()
    host_ip, address = _subnet(_allocate_index())
    state: dict = {"name": name, "address": address, "root": str(root), "devices": devices}
    _write(root / "state.json", json.dumps(state))
    merged = _mount_overlay(rootfs, root)
    host_key = _prepare_overlay(merged, name, key.with_name(key.name + ".pub").read_text())
    _write_client_files(root, name, address, key, host_key)
    console = root / "console.log"
    state["pid"] = _spawn(merged, name, devices, console)
    _write(root / "state.json", json.dumps(state))
    state["leader_pid"] = _wait_leader(state["pid"], console)
    state["host_veth"] = _peer_veth(state["leader_pid"], console)
    _write(root / "state.json", json.dumps(state))
    _enable_host_network()
    _address_veth(state["leader_pid"], state["host_veth"], host_ip, address)
    _wait_ssh(address, state["pid"], name, console)
    server = LabServer(
        name=name,
        address=address,
        pid=state["pid"],
        leader_pid=state["leader_pid"],
        root=root,
        ssh_key=key,
        known_hosts=root / "known_hosts",
        inventory=root / "inventory.yml",
        ssh_config=root / "ssh_config",
        host_veth=state["host_veth"],
        devices=devices,
        alive=True,
    )
    _write(root / "state.json", json.dumps(server.to_dict(), indent=2))
    return server


def _remove_nspawn_leftovers(name: str, merged: Path) -> None:
    """What a killed systemd-nspawn leaves in /run (it cleans up only on orderly exit)."""
    base = Path("/run/systemd/nspawn")
    with contextlib.suppress(OSError):
        if _is_mounted(merged):
            st = os.stat(merged)
            (base / "locks" / f"inode-{st.st_dev}:{st.st_ino}").unlink(missing_ok=True)
    shutil.rmtree(base / "propagate" / name, ignore_errors=True)


def _teardown(name: str, graceful: bool = True) -> bool:
    """Stop, unmount and delete whatever exists of NAME (also half-made servers).

    graceful=False kills at once: for servers that are thrown away unbooted or dead.
    """
    root = paths.lab_dir() / name
    if not root.exists():
        return False
    state = _read_state(name)
    _stop(int(state.get("pid") or 0), int(state.get("leader_pid") or 0), name, graceful)
    _delete_link(state.get("host_veth", ""))
    merged = root / "merged"
    _remove_nspawn_leftovers(name, merged)
    _umount(merged)
    if _is_mounted(merged):
        raise LabError(f"{merged} is still mounted: unmount it by hand, then run lab down {name} again")
    try:
        shutil.rmtree(root)
    except OSError as exc:
        raise LabError(f"cannot delete {root} ({exc}): delete it by hand") from exc
    return True


def _failed_console(name: str) -> Path:
    return paths.lab_dir() / f"{name}.failed-console.log"


def _keep_console(name: str) -> Path | None:
    """Keep the console log of a failed up (its server dir is deleted)."""
    console = paths.lab_dir() / name / "console.log"
    if not console.is_file():
        return None
    with contextlib.suppress(OSError):
        shutil.copyfile(console, _failed_console(name))
        return _failed_console(name)
    return None


def up(name: str, *, devices: Sequence[str] = ()) -> LabServer:
    """Boot lab server NAME, or return it unchanged if it is running (devices included).

    A stale NAME (its nspawn process died, or an earlier up failed half way) is torn
    down and created again. Any failure tears down what this call made.
    """
    _validate_name(name)
    _check_environment()
    devices = _check_devices(devices)
    rootfs = ensure_rootfs()
    with _locked(paths.lab_dir() / ".lock"):
        existing = _server_from_state(_read_state(name))
        if existing is not None and existing.alive:
            return existing
        _teardown(name, graceful=False)
        _failed_console(name).unlink(missing_ok=True)
        try:
            return _create(name, devices, rootfs)
        except BaseException as exc:
            kept = _keep_console(name)
            with contextlib.suppress(Exception):
                _teardown(name, graceful=False)
                _release_host_network_if_idle()
            if isinstance(exc, LabError) and kept:
                console = str(paths.lab_dir() / name / "console.log")
                raise LabError(str(exc).replace(console, str(kept))) from exc
            raise


def down(name: str) -> bool:
    """Tear lab server NAME down; True if something was torn down."""
    _validate_name(name)
    _check_environment()
    with _locked(paths.lab_dir() / ".lock"):
        removed = _teardown(name)
        _failed_console(name).unlink(missing_ok=True)
        _release_host_network_if_idle()
    return removed


@contextlib.contextmanager
def frozen() -> Iterator[None]:
    """Hold the lab lock: no server comes up or goes down meanwhile (for consistent checks)."""
    with _locked(paths.lab_dir() / ".lock"):
        yield


def list_servers() -> list[LabServer]:
    """Every lab server in lab_dir(), alive or not (see .alive)."""
    servers = [_server_from_state(state) for state in _all_states()]
    return [s for s in servers if s is not None]
