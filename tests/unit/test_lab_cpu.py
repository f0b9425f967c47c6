"""A lab server's cpu cgroup (provisioner.lab.cpu) on fake cgroup trees of either version, and the
command that starts a process inside one, run for real."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from provisioner.lab import cpu, processes
from provisioner.lab.common import LabError
from provisioner.lab.state import LabServer


def v1_tree(root: Path) -> Path:
    (root / "cpu").mkdir(parents=True)
    (root / "cpu" / "cpu.shares").write_text("1024\n")
    return root


def v2_tree(root: Path, controllers: str = "cpuset cpu io memory pids", enabled: str = "memory pids") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text(enabled + "\n")
    return root


def test_under_cgroup_v1_the_weight_becomes_shares_of_1024_per_100(tmp_path: Path) -> None:
    root = v1_tree(tmp_path)
    procs = cpu.create("pv-a", 1000, root)
    assert procs == root / "cpu" / "provisioner-lab-pv-a" / "cgroup.procs"
    assert (procs.parent / "cpu.shares").read_text() == "10240"
    (procs.parent / "cpu.shares").unlink()  # a cgroup's files go with its rmdir; a plain directory's do not
    cpu.remove("pv-a", root)
    assert not procs.parent.exists()


def test_under_cgroup_v2_the_weight_is_written_and_the_cpu_controller_enabled_for_the_groups(tmp_path: Path) -> None:
    root = v2_tree(tmp_path)
    procs = cpu.create("pv-a", 1000, root)
    assert procs == root / "provisioner-lab-pv-a" / "cgroup.procs"
    assert (procs.parent / "cpu.weight").read_text() == "1000"
    # A real cgroupfs takes "+cpu" as an instruction; the fake file only records it.
    assert (root / "cgroup.subtree_control").read_text() == "+cpu"
    (procs.parent / "cpu.weight").unlink()
    cpu.remove("pv-a", root)
    assert not procs.parent.exists()


def test_a_v2_tree_with_the_controller_enabled_is_left_as_it_is(tmp_path: Path) -> None:
    root = v2_tree(tmp_path, enabled="cpu memory")
    cpu.create("pv-a", 50, root)
    assert (root / "cgroup.subtree_control").read_text() == "cpu memory\n"


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        (lambda root: v2_tree(root, controllers="memory pids"), "cgroup v2's cpu controller"),
        (lambda root: root.mkdir() or root, "does not mount at"),
    ],
)
def test_a_machine_without_the_cpu_controller_is_named(tmp_path: Path, tree, message: str) -> None:
    root = tree(tmp_path / "cg")
    with pytest.raises(LabError, match=message):
        cpu.create("pv-a", 1000, root)


@pytest.mark.parametrize("weight", [0, 10_001])
def test_a_weight_out_of_bounds_is_refused(tmp_path: Path, weight: int) -> None:
    with pytest.raises(LabError, match=f"CPU weight {weight}: give a weight from 1 to 10000"):
        cpu.create("pv-a", weight, v1_tree(tmp_path))


def test_an_unwritable_tree_is_named(tmp_path: Path) -> None:
    root = v1_tree(tmp_path)
    (root / "cpu" / "provisioner-lab-pv-a").write_text("a file where the group would go")
    with pytest.raises(LabError, match="cannot make the cpu cgroup"):
        cpu.create("pv-a", 1000, root)


def test_removing_a_group_removes_the_groups_below_it_first(tmp_path: Path) -> None:
    """Under v2 nspawn makes payload/ and supervisor/ below the group it is started in."""
    root = v2_tree(tmp_path)
    top = root / "provisioner-lab-pv-a"
    for below in ("payload/system.slice/ssh.service", "payload/init.scope", "supervisor"):
        (top / below).mkdir(parents=True)
    cpu.remove("pv-a", root)
    assert not top.exists()
    cpu.remove("pv-a", root)  # nothing left: nothing to do


def test_a_group_left_by_an_earlier_server_is_replaced(tmp_path: Path) -> None:
    root = v1_tree(tmp_path)
    (root / "cpu" / "provisioner-lab-pv-a" / "payload").mkdir(parents=True)
    procs = cpu.create("pv-a", 200, root)
    assert (procs.parent / "cpu.shares").read_text() == "2048"
    assert not (procs.parent / "payload").exists()


def test_a_group_that_stays_is_named(tmp_path: Path) -> None:
    root = v1_tree(tmp_path)
    top = root / "cpu" / "provisioner-lab-pv-a"
    top.mkdir()
    (top / "a file a plain directory keeps").write_text("")
    with pytest.raises(LabError, match=f"cannot remove the cpu cgroup {top} .*: remove it by hand"):
        cpu.remove("pv-a", root)


def test_a_process_left_in_the_group_is_killed_before_the_group_goes(tmp_path: Path, monkeypatch) -> None:
    root = v1_tree(tmp_path)
    top = root / "cpu" / "provisioner-lab-pv-a"
    top.mkdir()
    left = subprocess.Popen(["sleep", "600"])
    (top / "cgroup.procs").write_text(f"{left.pid}\n")
    real_pids = cpu._pids

    def pids(groups: list[Path]) -> list[int]:
        # A real cgroup.procs empties as its processes exit and goes with the group's rmdir: the fake one too.
        if left.poll() is not None:
            (top / "cgroup.procs").unlink(missing_ok=True)
        return real_pids(groups)

    monkeypatch.setattr(cpu, "_pids", pids)
    try:
        cpu.remove("pv-a", root)
        assert left.wait(timeout=10) == -9 and not top.exists()
    finally:
        if left.poll() is None:
            left.kill()


def test_the_joined_command_writes_its_own_pid_then_execs_the_command(tmp_path: Path) -> None:
    procs = tmp_path / "cgroup.procs"
    proc = subprocess.Popen(cpu.joined(["sh", "-c", 'echo "$$ $0"', "started"], procs), stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    # The command runs as the same process (exec): the PID written is the PID it reports, and Popen's.
    assert out.split() == [procs.read_text().strip(), "started"] == [str(proc.pid), "started"]


def test_a_shell_that_cannot_join_says_so_and_runs_nothing(tmp_path: Path) -> None:
    procs = tmp_path / "no such dir" / "cgroup.procs"
    r = subprocess.run(cpu.joined(["echo", "ran"], procs), capture_output=True, text=True, timeout=30)
    assert r.returncode == 97 and r.stdout == ""
    assert f"provisioner lab: cannot join the cpu cgroup {procs}" in r.stderr


def test_nspawn_starts_inside_the_group_when_there_is_one(tmp_path: Path, monkeypatch) -> None:
    started: list[list[str]] = []

    class Popen:
        def __init__(self, cmd: list[str], **kwargs: object) -> None:
            started.append(cmd)
            self.pid = 4242

    monkeypatch.setattr(processes.subprocess, "Popen", Popen)
    procs = tmp_path / "cgroup.procs"
    processes.spawn(tmp_path, "pv-unit", [], tmp_path / "console.log", procs)
    processes.spawn(tmp_path, "pv-unit", [], tmp_path / "console.log")
    processes._CHILDREN.pop(4242, None)
    nspawn = processes.nspawn_cmd(tmp_path, "pv-unit", [])
    assert started == [cpu.joined(nspawn, procs), nspawn]


def test_the_weight_is_kept_in_the_state_and_a_state_without_it_has_none() -> None:
    data = LabServer.from_dict({"name": "pv-unit", "cpu_weight": 1000}).to_dict()
    assert data["cpu_weight"] == 1000 and LabServer.from_dict(data).cpu_weight == 1000
    assert LabServer.from_dict({"name": "pv-unit"}).cpu_weight is None
