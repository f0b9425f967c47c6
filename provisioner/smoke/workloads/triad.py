"""The STREAM triad's memory bandwidth against the DIMMs' theoretical DRAM bandwidth.

Measures on the target (w_triad, in the ML environment); judged on the control node, which reads
results.triad: gbps, how, n, times_s, threads, bytes_moved; and the raw result's memory (through
provisioner.smoke.hardware.dram_gbps).
"""

from __future__ import annotations

import time
from typing import Any

from ..base import INFO, WARN, Check, Objective, _problem, grade, span
from ..hardware import dram_gbps
from ..target.ml import median

NAME = "triad"
# The plan values whose change moves its figures: what the tuner may search (registry: KNOBS).
KNOBS: tuple[str, ...] = ("threads_per_job", "omp_proc_bind", "thp_enabled", "thp_defrag")
# What `provisioner tune` optimises: the triad's bandwidth over arrays of hundreds of MB, which THP's
# mode and defrag policy move (huge pages or not under the TLB, and whether a fault waits for one;
# torch asks for none with madvise, numpy does).
TUNE = Objective("GB/s", True, lambda r: float(r["gbps"]))


# ---------------------------------------------------------------- target, ML environment

SIZES: dict[str, dict[str, Any]] = {
    "quick": {"triad_n": 20_000_000, "triad_repeats": 5},
    "full": {"triad_n": 80_000_000, "triad_repeats": 10},
}


def w_triad(p: dict[str, Any]) -> dict[str, Any]:
    """STREAM triad a = b + s*c: one fused pass with torch (3 arrays of traffic), else numpy in two."""
    import importlib.util

    s = SIZES[p["profile"]]
    n = s["triad_n"]
    times = []
    if importlib.util.find_spec("torch") is not None:
        import torch

        b, c = torch.rand(n, dtype=torch.float64), torch.rand(n, dtype=torch.float64)
        a = torch.empty(n, dtype=torch.float64)
        torch.add(b, c, alpha=3.0, out=a)
        for _ in range(s["triad_repeats"]):
            t0 = time.perf_counter()
            torch.add(b, c, alpha=3.0, out=a)
            times.append(time.perf_counter() - t0)
        arrays, how, threads = 3, "torch.add(b, c, alpha=s, out=a): one fused pass", torch.get_num_threads()
    else:
        import numpy as np

        b, c = np.random.rand(n), np.random.rand(n)
        a = np.empty(n)
        for _ in range(s["triad_repeats"] + 1):
            t0 = time.perf_counter()
            np.multiply(c, 3.0, out=a)
            np.add(a, b, out=a)
            times.append(time.perf_counter() - t0)
        times = times[1:]
        arrays, how, threads = 5, "numpy multiply then add (two passes, 5 arrays of traffic; torch not installed)", 1
    moved = arrays * 8 * n
    return {"n": n, "bytes_moved": moved, "how": how, "threads": threads, "times_s": times, "gbps": moved / median(times) / 1e9}


WORKERS = {"triad": w_triad}


# ---------------------------------------------------------------- control node

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
