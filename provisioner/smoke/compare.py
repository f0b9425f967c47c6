"""Before/after and regressions: the unprovisioned machine's figure next to each figure (gain), and
figures more than REGRESSION worse than the host's last run of the same kind flagged.

Runs on the control node, over judged reports (no raw keys).
"""

from __future__ import annotations

from .base import _RANK, WARN, Check, HostReport
from .cost import COST_SOURCES

# A figure that falls more than this below the host's last run of the same kind is a regression.
REGRESSION = 0.15
# Figures that only illustrate (the oversubscribed run shows what the thread plan saves):
# neither a regression nor a before -> after gain is read from them.
ILLUSTRATIONS = frozenset({"hpo.oversubscribed", "host.load"})


def _better_ratio(check: Check, other: float) -> float | None:
    if not check.figure or not other:
        return None
    return check.figure / other if check.higher_is_better else other / check.figure


def attach_baseline(report: HostReport, baseline: HostReport | None) -> None:
    """Put the unprovisioned machine's figure next to each figure (gain = after / before)."""
    if baseline is None:
        return
    report.baseline_started = baseline.started
    before = {c.id: c.figure for c in baseline.checks if c.figure is not None}
    after = {c.id: c.figure for c in report.checks if c.figure is not None}
    for c in report.checks:
        source = next((src for prefix, src in COST_SOURCES.items() if c.id.startswith(prefix)), None)
        if source and c.figure and before.get(source) and after.get(source):
            # What the baseline's throughput cost at this run's price (the baseline may have had none).
            c.baseline = c.figure * after[source] / before[source]
            c.gain = _better_ratio(c, c.baseline)
        elif c.id in before and c.id not in ILLUSTRATIONS:
            c.baseline = before[c.id]
            c.gain = _better_ratio(c, before[c.id])
    if "baseline" in baseline.curves:
        report.curves["baseline"] = baseline.curves["baseline"]


def flag_regressions(report: HostReport, previous: HostReport | None, threshold: float = REGRESSION) -> None:
    """Flag figures more than `threshold` worse than the host's last run of the same mode and profile."""
    if previous is None:
        return
    report.previous_started = previous.started
    last = {c.id: c.figure for c in previous.checks if c.figure is not None}
    for c in report.checks:
        # A cost follows its throughput (judged already) and the price the user gave.
        if c.id not in last or c.figure is None or c.id in ILLUSTRATIONS or c.group == "cost":
            continue
        c.previous = last[c.id]
        change = _better_ratio(c, last[c.id])
        # Within this run's own spread, the last figure is noise, not a change.
        noise = c.spread is not None and c.spread[0] <= last[c.id] <= c.spread[1]
        if change is not None and change < 1 - threshold and not noise:
            c.regression = True
            if _RANK[c.status] < _RANK[WARN]:
                c.status = WARN
            c.reason += f"; regression: {1 - change:.0%} worse than the last run ({previous.started}: {last[c.id]:,.3g} {c.unit})"
