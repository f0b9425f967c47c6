"""A PyTorch MLP training step against torch's own SGEMM rate in the same process.

Runs on the control node. Reads results.mlp: gflops, sgemm_gflops, sgemm_n, samples_per_s,
step_s, threads, mkl, mkldnn, torch, batch, width; the raw result's mode and threads.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from ..base import FAIL, WARN, Check, _problem, grade, span, worst

NAME = "mlp"

MLP_GRADES = (0.4, 0.2)  # an MLP step is mostly GEMMs; below 0.2 the threads or the kernel are wrong


def step_against_sgemm(
    check_id: str,
    group: str,
    title: str,
    step: dict[str, Any],
    whose: str,
    judge: Callable[[str, list[str]], str],
    basis: str,
    detail: str,
) -> list[Check]:
    """A training step's GFLOPS against `whose` own SGEMM rate in the same process (PyTorch's, and
    TensorFlow's), graded by MLP_GRADES; `judge` takes that grade and the reasons, adds what the
    framework's own settings say to the reasons and returns the status."""
    problem = _problem(check_id, group, title, step)
    if problem:
        return [problem]
    fig, limit = step["gflops"], step["sgemm_gflops"]
    ratio = fig / limit
    reasons = [f"{ratio:.0%} of {whose} SGEMM rate ({step['samples_per_s']:,.0f} samples/s)"]
    status = judge(grade(ratio, MLP_GRADES), reasons)
    return [Check(check_id, group, title, status, "; ".join(reasons), fig, "GFLOPS", limit, basis, ratio, detail=detail)]


def mlp_checks(raw: dict[str, Any], mlp: dict[str, Any]) -> list[Check]:
    def judge(status: str, reasons: list[str]) -> str:
        want = raw.get("threads") if raw.get("mode") == "tuned" else None
        if want and mlp.get("threads") != want:
            status = FAIL
            reasons.append(f"torch uses {mlp.get('threads')} threads, the plan says {want}")
        if not (mlp.get("mkl") and mlp.get("mkldnn")):
            status = worst(status, WARN)
            reasons.append(
                f"MKL {'on' if mlp.get('mkl') else 'off'}, oneDNN {'on' if mlp.get('mkldnn') else 'off'}: not a CPU build with both"
            )
        return status

    detail = (
        f"torch {mlp.get('torch')}, {mlp.get('threads')} threads, batch {mlp.get('batch')}, width {mlp.get('width')}, "
        f"median of {len(mlp.get('step_s', []))}"
    )
    basis = f"torch.mm SGEMM n={mlp.get('sgemm_n')} in the same process, same threads"
    return step_against_sgemm("torch.mlp", "pytorch", "PyTorch MLP training step", mlp, "torch's", judge, basis, detail)


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return mlp_checks(raw, result)


def spreads(mlp: dict[str, Any]) -> dict[str, list[float] | None]:
    """GFLOPS of each step: the median step's GFLOPS scaled by its time."""
    if mlp.get("step_s") and mlp.get("gflops"):
        mid = statistics.median(mlp["step_s"])
        return {"torch.mlp": span([mlp["gflops"] * mid / t for t in mlp["step_s"]])}
    return {}
