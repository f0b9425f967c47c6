"""The STREAM triad's memory bandwidth against the DIMMs' theoretical DRAM bandwidth.

Runs on the control node. Reads results.triad: gbps, how, n, times_s, threads, bytes_moved; and
the raw result's memory (through provisioner.smoke.hardware.dram_gbps).
"""

from __future__ import annotations

from typing import Any

from ..base import INFO, WARN, Check, _problem, grade, span
from ..hardware import dram_gbps

NAME = "triad"

TRIAD_GRADES = (0.6, 0.0)  # STREAM triad 74-82% of DRAM; the channel count is assumed: never a fail


def triad_check(raw: dict[str, Any], triad: dict[str, Any]) -> Check:
    title = "memory bandwidth (STREAM triad)"
    problem = _problem("memory.triad", "memory", title, triad)
    if problem:
        return problem
    fig = triad["gbps"]
    detail = f"{triad.get('how')}, n={triad.get('n')}, median of {len(triad.get('times_s', []))}, threads {triad.get('threads')}"
    limit, basis = dram_gbps(raw.get("memory", {}))
    if limit is None:
        return Check(
            "memory.triad", "memory", title, INFO, f"reported without a ratio: {basis}", fig, "GB/s", basis=basis, detail=detail
        )
    ratio = fig / limit
    status = grade(ratio, TRIAD_GRADES)
    reason = f"{ratio:.0%} of theoretical DRAM bandwidth (STREAM reaches 74-82%)"
    if status == WARN:
        reason += "; fewer channels populated than DIMMs, or threads below the cores"
    return Check("memory.triad", "memory", title, status, reason, fig, "GB/s", limit, basis, ratio, detail=detail)


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return [triad_check(raw, result)]


def spreads(triad: dict[str, Any]) -> dict[str, list[float] | None]:
    """GB/s of each repeat: the bytes moved over its time."""
    if triad.get("bytes_moved") and all(triad.get("times_s") or [0]):
        return {"memory.triad": span([triad["bytes_moved"] / t / 1e9 for t in triad["times_s"]])}
    return {}
