"""The systemd-nspawn process of each lab server: its command line, start, the container's
PID 1, sshd answering, stop, and what a killed nspawn leaves behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from . import cpu
from .common import LabError
from .mounts import is_mounted

SSH_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
START_TIMEOUT_S = 10.0  # nspawn to leader and host0 visible


def proc_state(pid: int) -> str | None:
    """Process state letter from /proc/PID/stat, None if no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


# systemd-nspawn processes started by this process, to collect their exit status.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our own child (no zombie left)."""
    proc = _CHILDREN.get(pid)
    if proc is not None and proc.poll() is not None:
        del _CHILDREN[pid]


def is_nspawn_argv(argv: Sequence[bytes], name: str) -> bool:
    """True if a /proc/PID/cmdline split at NULs is a systemd-nspawn for machine NAME."""
    return bool(argv) and os.path.basename(argv[0]) == b"systemd-nspawn" and f"--machine={name}".encode() in argv


def is_our_nspawn(pid: int, name: str) -> bool:
    """True if PID is a running (not zombie) systemd-nspawn for machine NAME."""
    if pid <= 0:
        return False
    _reap(pid)
    if proc_state(pid) in (None, "Z", "X"):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return is_nspawn_argv(argv, name)


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


def nspawn_cmd(merged: Path, name: str, devices: Sequence[str]) -> list[str]:
    """Boot MERGED as machine NAME with a veth of its own, binding DEVICES in."""
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
    return cmd + [f"--bind={dev}" for dev in devices]


def spawn(merged: Path, name: str, devices: Sequence[str], console: Path, cgroup_procs: Path | None = None) -> int:
    """Start systemd-nspawn in a session of its own, its output appended to CONSOLE; its PID.
    CGROUP_PROCS: the cgroup.procs file of the cpu cgroup it starts in (provisioner.lab.cpu)."""
    cmd = nspawn_cmd(merged, name, devices)
    with open(console, "ab") as out:
        proc = subprocess.Popen(
            cpu.joined(cmd, cgroup_procs) if cgroup_procs else cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    _CHILDREN[proc.pid] = proc
    return proc.pid


def wait_leader(pid: int, console: Path) -> int:
    """The container's PID 1: the nspawn child living in its own pid and net namespaces."""
    own_pid_ns, own_net_ns = _ns(os.getpid(), "pid"), _ns(os.getpid(), "net")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for child in _children(pid):
            pid_ns, net_ns = _ns(child, "pid"), _ns(child, "net")
            if pid_ns and net_ns and pid_ns != own_pid_ns and net_ns != own_net_ns:
                return child
        if proc_state(pid) in (None, "Z"):
            raise LabError(f"systemd-nspawn exited at start: see {console}")
        time.sleep(0.02)
    raise LabError(f"systemd-nspawn started no container in {START_TIMEOUT_S:.0f} s: see {console}")


def wait_ssh(address: str, pid: int, name: str, console: Path) -> None:
    """Until sshd sends its banner on port 22, at most SSH_TIMEOUT_S."""
    deadline = time.monotonic() + SSH_TIMEOUT_S
    while time.monotonic() < deadline:
        if not is_our_nspawn(pid, name):
            raise LabError(f"lab server {name} stopped while booting: see {console}")
        with contextlib.suppress(OSError), socket.create_connection((address, 22), timeout=1.0) as sock:
            sock.settimeout(2.0)
            if sock.recv(64).startswith(b"SSH-"):
                return
        time.sleep(0.1)
    raise LabError(f"sshd in lab server {name} did not answer on {address}:22 in {SSH_TIMEOUT_S:.0f} s: see {console}")


def _signal(pid: int, sig: int, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _wait_gone(pid: int, name: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_our_nspawn(pid, name):
            return True
        time.sleep(0.05)
    return not is_our_nspawn(pid, name)


def stop(pid: int, leader_pid: int, name: str, graceful: bool = True) -> None:
    """SIGTERM nspawn (systemd halts), after STOP_TIMEOUT_S SIGKILL its process group.

    SIGTERM is repeated every second: nspawn turns it into SIGRTMIN+3 for the
    container's systemd, which is lost if systemd has not set up its handlers yet.
    """
    if not is_our_nspawn(pid, name):
        return
    if graceful:
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            _signal(pid, signal.SIGTERM)
            if _wait_gone(pid, name, min(1.0, max(0.0, deadline - time.monotonic()))):
                return
    _signal(pid, signal.SIGKILL, group=True)
    if leader_pid > 0 and proc_state(leader_pid) not in (None, "Z"):
        _signal(leader_pid, signal.SIGKILL)
    if not _wait_gone(pid, name, 5.0):
        raise LabError(f"systemd-nspawn PID {pid} for lab server {name} survived SIGKILL: kill it by hand")


def remove_nspawn_leftovers(name: str, merged: Path) -> None:
    """What a killed systemd-nspawn leaves in /run (it cleans up only on orderly exit)."""
    base = Path("/run/systemd/nspawn")
    with contextlib.suppress(OSError):
        if is_mounted(merged):
            st = os.stat(merged)
            (base / "locks" / f"inode-{st.st_dev}:{st.st_ino}").unlink(missing_ok=True)
    shutil.rmtree(base / "propagate" / name, ignore_errors=True)
