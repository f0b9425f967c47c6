"""A container lab server's share of this machine's CPUs: a cpu cgroup of its own, with a weight.

Linux's scheduler gives every session an equal share of the CPUs (autogroup, on by default), and
a process's niceness counts only against the processes of its own session: a container whose
every login and service is a session of its own cannot be put ahead of other work with `nice`.
A cpu cgroup can: every process the server starts stays in it, whatever sessions it makes, and
the group as a whole weighs its weight against the others (cgroup v2's cpu.weight, 100 for a
session; under v1, cpu.shares, 1024 for the same). A server that measures (a smoke test, a
baseline, tune) gets a high weight, so that on a machine busy with other work its OpenMP threads
are not left waiting for a core the way they never wait on a server of their own (docs/lab.md).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from .common import LabError

CGROUP_ROOT = Path("/sys/fs/cgroup")
DEFAULT_WEIGHT = 100  # cgroup v2's weight of a group (a session) that nobody weighed
MIN_WEIGHT, MAX_WEIGHT = 1, 10_000  # cgroup v2's bounds of cpu.weight


def group_name(name: str) -> str:
    return f"provisioner-lab-{name}"


def _v2(root: Path) -> bool:
    return (root / "cgroup.controllers").is_file()


def create(name: str, weight: int, root: Path = CGROUP_ROOT) -> Path:
    """Server NAME's cpu cgroup with WEIGHT; the cgroup.procs file a process joins it by."""
    if not MIN_WEIGHT <= weight <= MAX_WEIGHT:
        raise LabError(f"CPU weight {weight}: give a weight from {MIN_WEIGHT} to {MAX_WEIGHT} (100: as any other session)")
    if _v2(root):
        if "cpu" not in (root / "cgroup.controllers").read_text().split():
            raise LabError(f"a CPU weight needs cgroup v2's cpu controller, which {root}/cgroup.controllers does not offer")
        group, setting, value = root / group_name(name), "cpu.weight", str(weight)
        subtree = root / "cgroup.subtree_control"
        if "cpu" not in subtree.read_text().split():
            _write(subtree, "+cpu")
    elif (root / "cpu" / "cpu.shares").is_file():
        group, setting, value = root / "cpu" / group_name(name), "cpu.shares", str(weight * 1024 // DEFAULT_WEIGHT)
    else:
        raise LabError(f"a CPU weight needs the cpu cgroup controller, which this machine does not mount at {root}")
    try:
        group.mkdir(exist_ok=True)
    except OSError as exc:
        raise LabError(f"cannot make the cpu cgroup {group} ({exc.strerror}): a CPU weight needs a writable cgroup tree") from exc
    _write(group / setting, value)
    return group / "cgroup.procs"


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise LabError(f"cannot write {value} to {path} ({exc.strerror})") from exc


def joined(command: list[str], procs: Path) -> list[str]:
    """COMMAND started inside the cgroup whose cgroup.procs is PROCS: a shell joins it, then execs
    COMMAND (its PID and command line are COMMAND's, and nothing it starts runs outside)."""
    return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs), *command]


def remove(name: str, root: Path = CGROUP_ROOT) -> None:
    """Server NAME's cpu cgroup, once no process is left in it (under either cgroup version)."""
    for group in (root / group_name(name), root / "cpu" / group_name(name)):
        with contextlib.suppress(OSError):
            group.rmdir()
