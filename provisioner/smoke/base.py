"""The smoke judgement's types: a check, a host's report, the statuses and how a ratio is graded.

Runs on the control node. Every other module of the package sits above this one (hardware,
the workloads, the registry, the judgement, the history); this one imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

PASS, WARN, FAIL, SKIP, INFO = "pass", "warn", "fail", "skip", "info"
_RANK = {PASS: 0, INFO: 0, SKIP: 0, WARN: 1, FAIL: 2}


@dataclass
class Check:
    id: str
    group: str
    title: str
    status: str
    reason: str
    figure: float | None = None
    unit: str = ""
    limit: float | None = None
    basis: str = ""
    ratio: float | None = None
    higher_is_better: bool = True
    detail: str = ""
    baseline: float | None = None
    gain: float | None = None  # after / before, >1 is better whichever way the figure points
    previous: float | None = None
    regression: bool = False
    spread: list[float] | None = None  # lowest and highest of this run's repeats, in the figure's unit


@dataclass
class HostReport:
    host: str
    mode: str
    profile: str
    started: str
    seconds: float
    hardware: dict[str, Any]
    checks: list[Check]
    baseline_started: str | None = None
    previous_started: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    workloads: dict[str, float] = field(default_factory=dict)  # seconds each workload took
    # Latency against load of the model server, per mode ("tuned", "baseline"): one point per
    # connection level, {connections, requests_per_s, p50_ms, p99_ms}.
    curves: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return worst(*(c.status for c in self.checks))

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in (PASS, WARN, FAIL, SKIP, INFO)}
        for c in self.checks:
            out[c.status] += 1
        return out

    def to_dict(self, raw: bool = False) -> dict[str, Any]:
        d = {
            "host": self.host,
            "mode": self.mode,
            "profile": self.profile,
            "started": self.started,
            "seconds": self.seconds,
            "status": self.status,
            "counts": self.counts(),
            "hardware": self.hardware,
            "workloads": self.workloads,
            "curves": self.curves,
            "baseline_started": self.baseline_started,
            "previous_started": self.previous_started,
            "checks": [asdict(c) for c in self.checks],
        }
        if raw:
            d["raw"] = self.raw
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HostReport:
        return cls(
            host=d["host"],
            mode=d["mode"],
            profile=d["profile"],
            started=d["started"],
            seconds=d["seconds"],
            hardware=d.get("hardware", {}),
            checks=[Check(**c) for c in d.get("checks", [])],
            baseline_started=d.get("baseline_started"),
            previous_started=d.get("previous_started"),
            raw=d.get("raw", {}),
            workloads=d.get("workloads", {}),
            curves=d.get("curves", {}),
        )


@dataclass(frozen=True)
class Objective:
    """What `provisioner tune` optimises on a workload: one figure of the result its worker returns
    when run with tune=True (the same code as the smoke test, the part the knobs move only)."""

    unit: str
    higher_is_better: bool
    figure: Callable[[dict[str, Any]], float]


def number(value: float | None) -> str:
    """A figure as people read it: whole numbers from 100 up, else three significant digits."""
    if value is None:
        return ""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3g}"


def worst(*statuses: str) -> str:
    """The most serious of these statuses (pass, info and skip rank alike); pass for none."""
    return max(statuses, key=lambda s: _RANK[s], default=PASS)


def grade(ratio: float, grades: tuple[float, float]) -> str:
    ok, warn = grades
    return PASS if ratio >= ok else WARN if ratio >= warn else FAIL


def linear_scaling(
    all_rate: float, one_rate: float, cores: int, grades: tuple[float, float], scale: float = 1e6
) -> tuple[float, float, float, str, str]:
    """A rate on every core against the same work's one-thread rate x the cores (where no hardware
    figure bounds it), both shown divided by SCALE: (figure, limit, ratio, status, reason); slower
    on every core than on one fails."""
    fig = all_rate / scale
    limit = one_rate * cores / scale
    ratio = fig / limit
    speedup = all_rate / one_rate
    status = FAIL if speedup < 1 else grade(ratio, grades)
    reason = f"1 -> {cores} cores: {speedup:.1f}x ({ratio:.0%} of linear)"
    if status != PASS:
        reason += "; more threads barely help: oversubscription, a thread cap, or memory-bound"
    return fig, limit, ratio, status, reason


def _problem(check_id: str, group: str, title: str, result: dict[str, Any]) -> Check | None:
    """A check for a workload that could not run (skipped) or failed, else None."""
    if "skipped" in result:
        return Check(check_id, group, title, SKIP, result["skipped"])
    if "error" in result:
        return Check(check_id, group, title, FAIL, f"the workload failed: {result['error']}")
    return None


def span(values: list[float]) -> list[float] | None:
    """Lowest and highest of a workload's repeats (None for fewer than two): the run's own noise."""
    return [min(values), max(values)] if len(values) > 1 else None


def against_limit(
    ratio: float, grades: tuple[float, float], reason: str, measured_low: str, advice: str, above: float = 1.0
) -> tuple[str, str]:
    """A figure / limit ratio graded, and the reason with what it means: above `above` the limit was
    measured low (`measured_low` names what), below a pass `advice` says what to look at."""
    status = grade(ratio, grades)
    if ratio > above:
        reason += f": above the limit, so {measured_low} was measured low (a busy host?)"
    elif status != PASS:
        reason += f"; {advice}"
    return status, reason
