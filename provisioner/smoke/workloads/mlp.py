"""A PyTorch MLP training step against torch's own SGEMM rate in the same process.

Measured on the target (WORKERS, in the ML environment); judged on the control node, which
reads results.mlp: gflops, sgemm_gflops, sgemm_n, samples_per_s,
step_s, threads, mkl, mkldnn, torch, batch, width; the raw result's mode and threads.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from ..base import FAIL, WARN, Check, _problem, grade, span, worst
from ..target.ml import _missing, median

NAME = "mlp"
# The plan values whose change moves its figures: what the tuner may search (registry: KNOBS).
KNOBS: tuple[str, ...] = ("threads_per_job", "torch_interop_threads", "allocator")


# ---------------------------------------------------------------- target, ML environment

SIZES: dict[str, dict[str, Any]] = {
    "quick": {"mlp_batch": 2048, "mlp_width": 1024, "mlp_steps": 10, "mlp_repeats": 3},
    "full": {"mlp_batch": 4096, "mlp_width": 2048, "mlp_steps": 20, "mlp_repeats": 5},
}


def w_mlp(p: dict[str, Any]) -> dict[str, Any]:
    missing = _missing("torch", "torch")
    if missing:
        return missing
    import torch

    s = SIZES[p["profile"]]
    width, batch, inputs = s["mlp_width"], s["mlp_batch"], 256
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    sgemm = 2 * n**3 / median(times) / 1e9
    model = torch.nn.Sequential(
        torch.nn.Linear(inputs, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(batch, inputs), torch.randn(batch, 1)
    loss_fn = torch.nn.MSELoss()

    def step() -> None:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    step_times = []
    for _ in range(s["mlp_repeats"]):
        t0 = time.perf_counter()
        for _ in range(s["mlp_steps"]):
            step()
        step_times.append((time.perf_counter() - t0) / s["mlp_steps"])
    weights = inputs * width + width * width + width
    flops = 6 * batch * weights  # forward 2, backward 4 FLOPs per weight and sample
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "mkl": torch.backends.mkl.is_available(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "batch": batch,
        "width": width,
        "step_s": step_times,
        "samples_per_s": batch / median(step_times),
        "gflops": flops / median(step_times) / 1e9,
        "sgemm_gflops": sgemm,
        "sgemm_n": n,
    }


WORKERS = {"mlp": w_mlp}


# ---------------------------------------------------------------- control node

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
