"""Shared test set-up."""

from __future__ import annotations

import os
from collections import defaultdict

import pytest


@pytest.fixture(scope="session")
def lab_requirements() -> None:
    """Skip lab tests where lab servers cannot run, naming what is missing.

    With PROVISIONER_REQUIRE_LAB=1 (the test script sets it) a missing piece fails
    instead: there, a skip would hide a broken install.
    """
    from provisioner import lab

    _require("lab servers", lab.missing_requirement())


@pytest.fixture(scope="session")
def vm_requirements(lab_requirements: None) -> None:
    """As lab_requirements, for lab VMs (qemu and the image tools on top)."""
    from provisioner import lab

    _require("lab VMs", lab.missing_vm_requirement())


def _require(what: str, reason: str | None) -> None:
    if reason and os.environ.get("PROVISIONER_REQUIRE_LAB") == "1":
        pytest.fail(f"{what} are required here but unavailable: {reason}")
    if reason:
        pytest.skip(reason)


# With two workers (scripts/test.sh runs pytest-xdist): the files that share the lab server
# pv-test and its module fixtures, and tests/host (it changes live kernel values lab servers
# see), form one unit of work that runs on one worker, in order; every other test (each
# molecule scenario, the tests with servers of their own, the unit tests) is a unit of its
# own. The shared unit is the suite's longest: what needs no pv-test stays out of it.
# (xdist's own xdist_group mark does not take effect with this pytest.)
SHARED_LAB = ("test_lab.py", "test_contact.py", "test_interrupt.py", "test_host_tuning.py")
# Files whose tests share a lab server of their own (a module fixture): one unit each, so the
# server is booted once, on one worker, beside the shared-lab unit.
OWN_LAB = (
    "test_storage.py",  # a server per test (fresh_lab_server), all of its module
    "test_serving.py",
    "test_fleet.py",
    "test_proxy.py",
    "test_ray.py",
    "test_vm.py",
    "test_up.py",  # a fresh server (and a stock one for the baseline)
    "test_mlstack.py",  # server pv-mlstack and its wheelhouse: apart, one worker would take it down under the other
    "test_packaging.py",  # the wheel, built once
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class SharedLabScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

    return SharedLabScheduling(config, log)


def unit_of_work(nodeid: str) -> str:
    name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    if name in SHARED_LAB:
        return "shared-lab"
    return name if name in OWN_LAB else nodeid


# Where the suite's time goes, printed after the slowest tests: each worker's busy seconds (the
# suite takes as long as the busiest; the gap to the other is idle time), the largest units of
# work, the unit tests counted as one, so a change to the suite's shape can be judged by them, and
# how the machine's CPUs spent the run (busy is not CPU: a test waiting on a reboot, a download or
# the disk is busy too; idle CPU means a third worker could help, iowait that the disk is the limit).
_BUSY: defaultdict[str, float] = defaultdict(float)
_UNITS: defaultdict[str, float] = defaultdict(float)
_CPU_AT_START: list[int] = []


def cpu_times() -> list[int]:
    """The machine's CPU time so far, from /proc/stat: user, nice, system, idle, iowait, irq, softirq, steal (jiffies)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            return [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return []


def cpu_split(start: list[int], end: list[int]) -> str:
    """user+system, idle, iowait and steal as shares of the CPU time between two readings."""
    if len(start) != 8 or len(end) != 8:
        return ""
    d = [b - a for a, b in zip(start, end, strict=True)]
    total = sum(d) or 1
    shares = {"user+system": d[0] + d[1] + d[2] + d[5] + d[6], "idle": d[3], "iowait": d[4], "steal": d[7]}
    return ", ".join(f"{name} {100 * v / total:.0f}%" for name, v in shares.items())


def pytest_sessionstart(session: pytest.Session) -> None:
    _CPU_AT_START[:] = cpu_times()


@pytest.fixture(autouse=True)
def _blocking_stdio() -> None:
    """Each test starts with blocking stdin, stdout and stderr. ssh makes the stdio it inherits
    non-blocking while it runs; one killed at a timeout leaves it so for every process sharing it,
    and every ansible run after would refuse to start ("Ansible requires blocking IO")."""
    from provisioner.cli import blocking_stdio

    blocking_stdio()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # the xdist worker that ran it (on the controller)
    _BUSY[node.gateway.id if node is not None else "main"] += report.duration
    if report.nodeid.startswith("tests/unit/"):
        unit = "tests/unit (all)"
    elif "test_molecule.py::test_molecule[" in report.nodeid:
        unit = "molecule " + report.nodeid.rsplit("[", 1)[-1].rstrip("]")
    else:  # a test of its own counts with the rest of its file
        unit = unit_of_work(report.nodeid).split("::", 1)[0].rsplit("/", 1)[-1]
    _UNITS[unit] += report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _BUSY:
        return
    write = terminalreporter.write_line
    write("busy seconds per worker: " + ", ".join(f"{w} {s:.0f}" for w, s in sorted(_BUSY.items())))
    largest = sorted(_UNITS.items(), key=lambda kv: -kv[1])[:15]
    write("largest units of work (s): " + ", ".join(f"{u} {s:.0f}" for u, s in largest))
    split = cpu_split(_CPU_AT_START, cpu_times())
    if split:
        write(f"CPU over the run ({os.cpu_count()} CPUs): {split}")
