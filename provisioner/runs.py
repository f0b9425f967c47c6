"""A playbook run's outcome as plain data: per-host counts, changes with before/after text.

The engine builds these from ansible-runner's events; the renderer and the commands read
them without knowing anything of Ansible.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import ExitCode, interrupted_message


@dataclass
class HostResult:
    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    refused: int = 0  # failures of the input check: bad input, found before anything changed
    task: str = ""
    errors: list[str] = field(default_factory=list)
    # What a role says the operator must know though nothing failed (a task's `debug` message
    # starting with WARNING_PREFIX): an index left out, a port opened beyond loopback.
    warnings: list[str] = field(default_factory=list)
    # A rolling run stopped (too many failures in an earlier batch) before this host's turn.
    not_reached: bool = False

    @property
    def status(self) -> str:
        if self.unreachable:
            return "unreachable"
        if self.failed and self.failed == self.refused:
            return "refused"
        if self.failed:
            return "failed"
        if self.not_reached:
            return NOT_REACHED
        return "changed" if self.changed else "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "status": self.status,
            "ok": self.ok,
            "changed": self.changed,
            "failed": self.failed,
            "unreachable": self.unreachable,
            "skipped": self.skipped,
            "refused": self.refused,
            "errors": self.errors,
            "warnings": self.warnings,
        }


# A role's `ansible.builtin.debug` message starting with this is a warning for the summary.
WARNING_PREFIX = "WARNING "
NOT_REACHED = "not reached"
# Failures first: what needs the operator, then what the run stopped short of, then the rest.
STATUS_ORDER = ("unreachable", "failed", "refused", NOT_REACHED, "changed", "ok")


def failures_first(hosts: Iterable[HostResult]) -> list[HostResult]:
    """Hosts in the order a summary shows them: by STATUS_ORDER, then by name."""
    return sorted(hosts, key=lambda h: (STATUS_ORDER.index(h.status), h.host))


@dataclass(frozen=True)
class Diff:
    """What a change did to one thing: its text before and after, or a ready-made summary."""

    before: str = ""
    after: str = ""
    before_header: str = "before"
    after_header: str = "after"
    text: str = ""  # a summary the module wrote itself (e.g. the packages apt installs)


@dataclass
class Change:
    host: str
    task: str
    diff: list[Diff] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "task": self.task, "diff": [asdict(d) for d in self.diff]}


@dataclass
class RunResult:
    playbook: str
    check: bool
    rc: int
    hosts: dict[str, HostResult]
    facts: dict[str, dict[str, Any]]
    changes: list[Change]
    artifact_dir: Path
    seconds: float
    hostvars: dict[str, dict[str, Any]] = field(default_factory=dict)
    # A rolling run (--batch): fleet, hosts_per_batch, max_fail_percentage; empty otherwise.
    batch: dict[str, int] = field(default_factory=dict)
    # The signal (SIGINT, SIGTERM) that stopped the run before its end; 0 when it ran to the end.
    interrupted: int = 0

    @property
    def exit_code(self) -> ExitCode:
        if self.interrupted:
            return ExitCode.INTERRUPTED
        if any(h.unreachable for h in self.hosts.values()):
            return ExitCode.UNREACHABLE
        if any(h.status == "refused" for h in self.hosts.values()) and not any(h.status == "failed" for h in self.hosts.values()):
            return ExitCode.BAD_INPUT
        if any(h.failed or h.not_reached for h in self.hosts.values()) or self.rc != 0:
            return ExitCode.HOST_FAILED
        return ExitCode.OK

    def counts(self) -> dict[str, int]:
        """How many hosts ended in each status (every status, zeros included), and in all."""
        out = {status: 0 for status in STATUS_ORDER}
        for h in self.hosts.values():
            out[h.status] += 1
        return {"hosts": len(self.hosts), **out}

    @property
    def errors(self) -> list[str]:
        """Every host's one-line errors, failures first, each naming its host (in a fleet, a
        task's failure alone does not say where); an interrupted run's line first."""
        return ([interrupted_message(self.interrupted)] if self.interrupted else []) + [
            e if e.startswith(f"{h.host}: ") else f"{h.host}: {e}" for h in failures_first(self.hosts.values()) for e in h.errors
        ]

    @property
    def warnings(self) -> list[str]:
        """Every host's warnings, each naming its host, in the summary's host order."""
        return [f"{h.host}: {w}" for h in failures_first(self.hosts.values()) for w in dict.fromkeys(h.warnings)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "playbook": self.playbook,
            "check": self.check,
            "rc": self.rc,
            "exit_code": int(self.exit_code),
            "seconds": round(self.seconds, 2),
            "artifact_dir": str(self.artifact_dir),
            "batch": self.batch or None,
            "interrupted": signal.Signals(self.interrupted).name if self.interrupted else None,
            "summary": self.counts(),
            # Failures first, as the terminal table shows them.
            "hosts": {h.host: h.to_dict() for h in failures_first(self.hosts.values())},
            "changes": [c.to_dict() for c in self.changes],
        }


ProgressCallback = Callable[[HostResult], None]
