"""A container lab server's share of this machine's CPUs: a cpu cgroup of its own, with a weight.

Linux's scheduler gives every session an equal share of the CPUs (autogroup, on by default), and
a process's niceness counts only against the processes of its own session: a container whose
every login and service is a session of its own cannot be put ahead of other work with `nice`.
A cpu cgroup can: every process the server starts stays in it (or below it), whatever sessions
it makes, and the group as a whole weighs its weight against its siblings: under cgroup v1 with
the rest of the machine's work in the root group, against each session's autogroup (cpu.shares,
1024 for a session); under v2, against the root's other groups (cpu.weight, 100 each, e.g.
systemd's system.slice and user.slice). A server that measures (a smoke test, a baseline, tune)
gets a high weight, so that on a machine busy with other work its OpenMP threads are not left
waiting for a core the way they never wait on a server of their own (docs/lab.md).

Under v2 nspawn takes the group as delegated to it and makes groups below it (payload,
supervisor): removing the group removes those first, and a group left by an earlier server of
the same name is emptied and removed before a new one is made.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from pathlib import Path

from .common import LabError

CGROUP_ROOT = Path("/sys/fs/cgroup")
DEFAULT_WEIGHT = 100  # cgroup v2's weight of a group nobody weighed
MIN_WEIGHT, MAX_WEIGHT = 1, 10_000  # cgroup v2's bounds of cpu.weight
EMPTY_TIMEOUT_S = 10.0  # for the processes killed in a group to be gone


def group_name(name: str) -> str:
    return f"provisioner-lab-{name}"


def _v2(root: Path) -> bool:
    return (root / "cgroup.controllers").is_file()


def group_dir(name: str, root: Path = CGROUP_ROOT) -> Path:
    """Where server NAME's group is (or would be) under this machine's cgroup version."""
    return root / group_name(name) if _v2(root) else root / "cpu" / group_name(name)


def weight_problem(weight: int) -> str | None:
    """What is wrong with WEIGHT as a group's weight (the fix named), or None."""
    if MIN_WEIGHT <= weight <= MAX_WEIGHT:
        return None
    return f"give a weight from {MIN_WEIGHT} to {MAX_WEIGHT} ({DEFAULT_WEIGHT}: as any other session)"


def create(name: str, weight: int, root: Path = CGROUP_ROOT) -> Path:
    """Server NAME's cpu cgroup with WEIGHT; the cgroup.procs file a process joins it by."""
    if problem := weight_problem(weight):
        raise LabError(f"CPU weight {weight}: {problem}")
    if _v2(root):
        if "cpu" not in (root / "cgroup.controllers").read_text().split():
            raise LabError(f"a CPU weight needs cgroup v2's cpu controller, which {root}/cgroup.controllers does not offer")
        setting, value = "cpu.weight", str(weight)
    elif (root / "cpu" / "cpu.shares").is_file():
        setting, value = "cpu.shares", str(weight * 1024 // DEFAULT_WEIGHT)
    else:
        raise LabError(f"a CPU weight needs the cpu cgroup controller, which this machine does not mount at {root}")
    group = group_dir(name, root)
    remove(name, root)  # a group an earlier server of this name left behind
    if _v2(root):
        # The weight file of a group exists only where its parent hands the cpu controller down.
        subtree = root / "cgroup.subtree_control"
        if "cpu" not in subtree.read_text().split():
            _write(
                subtree,
                "+cpu",
                "the cgroup root holds processes of its own, as a container's own cgroup namespace does: "
                "run the lab where the cgroup tree is the machine's",
            )
    try:
        group.mkdir()
    except OSError as exc:
        raise LabError(f"cannot make the cpu cgroup {group} ({exc.strerror}): a CPU weight needs a writable cgroup tree") from exc
    _write(group / setting, value)
    return group / "cgroup.procs"


def _write(path: Path, value: str, busy: str = "") -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        why = f": {busy}" if busy and exc.errno == errno.EBUSY else ""
        raise LabError(f"cannot write {value} to {path} ({exc.strerror}){why}") from exc


def joined(command: list[str], procs: Path) -> list[str]:
    """COMMAND started inside the cgroup whose cgroup.procs is PROCS: a shell joins it, then execs
    COMMAND (its PID and command line are COMMAND's, and nothing it starts runs outside). A shell
    that cannot join says so on its stderr (the server's console) and exits 97."""
    script = 'echo $$ > "$0" || { echo "provisioner lab: cannot join the cpu cgroup $0" >&2; exit 97; }; exec "$@"'
    return ["sh", "-c", script, str(procs), *command]


def _groups(top: Path) -> list[Path]:
    """TOP and every group below it, the deepest first."""
    below = [Path(d) for d, _subdirs, _files in os.walk(top)]
    return sorted(below, key=lambda p: len(p.parts), reverse=True)


def _pids(groups: list[Path]) -> list[int]:
    out: list[int] = []
    for group in groups:
        with contextlib.suppress(OSError, ValueError):
            out += [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
    return out


def remove(name: str, root: Path = CGROUP_ROOT) -> None:
    """Server NAME's cpu cgroup and the groups below it, every process still in them killed first
    (a container's processes outlive its nspawn for a moment when it is killed). Raises LabError
    naming the group when it stays."""
    top = group_dir(name, root)
    if not top.is_dir():
        return
    deadline = time.monotonic() + EMPTY_TIMEOUT_S
    while (pids := _pids(_groups(top))) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    for group in _groups(top):
        try:
            group.rmdir()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise LabError(f"cannot remove the cpu cgroup {group} ({exc.strerror}): remove it by hand (rmdir)") from exc
