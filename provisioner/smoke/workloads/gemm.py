"""DGEMM and SGEMM on all cores and on one, against the peak the CPU's FLOPs per cycle and clock give.

Runs on the control node. Reads results.gemm: n, dgemm_all/dgemm_one/sgemm_all/sgemm_one
({gflops, times_s, threads}), blas, kernel_check, and (through provisioner.smoke.hardware) the
clock figures; from the raw result cpu and threads.
"""

from __future__ import annotations

from typing import Any

from ..base import FAIL, INFO, PASS, Check, _problem, grade, span
from ..hardware import _clock, fp64_flops_per_cycle

NAME = "gemm"

# (pass at or above, warn at or above; below: fail) for figure / limit.
GEMM_GRADES = (0.6, 0.3)  # large DGEMM reaches 80-90% of peak; a Haswell kernel on AVX-512 reaches ~40%


def gemm_checks(raw: dict[str, Any], gemm: dict[str, Any]) -> list[Check]:
    titles = {
        "dgemm_all": "DGEMM, all cores",
        "dgemm_one": "DGEMM, one core",
        "sgemm_all": "SGEMM, all cores",
        "sgemm_one": "SGEMM, one core",
    }
    problem = _problem("compute.gemm", "compute", "GEMM", gemm)
    if problem:
        return [problem]
    cpu = raw.get("cpu", {})
    fpc, _fpc_basis = fp64_flops_per_cycle(cpu.get("vendor", ""), cpu.get("family", 0), cpu.get("model", 0), cpu.get("flags", []))
    clocks = {side: _clock(raw, side) for side in ("one", "all")}
    kernels = ", ".join(f"{b.get('internal_api')} {b.get('architecture')}" for b in gemm.get("blas", [])) or "unknown BLAS"
    verdict = gemm.get("kernel_check") or {}
    wrong_kernel = verdict.get("detail", "the BLAS kernel is wrong for this CPU") if verdict.get("status") == "fail" else ""
    out = []
    for key, title in titles.items():
        fig = gemm.get(key, {}).get("gflops")
        if fig is None:
            continue
        cores = 1 if key.endswith("_one") else int(raw.get("threads") or cpu.get("physical_cores") or 1)
        ghz, _how, clock_name = clocks["one" if key.endswith("_one") else "all"]
        per_cycle = fpc * (2 if key.startswith("s") else 1)
        cid = f"compute.{key}"
        detail = (
            f"n={gemm.get('n')}, median of {len(gemm[key].get('times_s', []))}, threads {gemm[key].get('threads')}, {kernels}"
        )
        if not ghz:
            out.append(
                Check(cid, "compute", title, INFO, "no clock known: reported without a ratio", fig, "GFLOPS", detail=detail)
            )
            continue
        limit = cores * per_cycle * ghz
        ratio = fig / limit
        status = grade(ratio, GEMM_GRADES)
        reason = f"{ratio:.0%} of peak"
        if wrong_kernel:
            # A kernel below the CPU's vectors is a fault whatever the ratio: an SSE kernel can
            # still reach half of a Zen 4 core's peak.
            status = FAIL
            reason += f"; {wrong_kernel}"
        elif ratio > 1.05 and clock_name.startswith("counted"):
            reason += ": above the peak at the counted clock, so the FLOPs/cycle assumed for this CPU are too low"
        elif ratio > 1.05:
            reason += ": above the peak at the assumed clock, so the cores run faster than it (boost)"
        elif status != PASS:
            reason += f"; large GEMMs reach 80-90%: check the BLAS kernel ({kernels}) and the thread count"
        basis = f"{cores} core(s) x {per_cycle} {'FP32' if key.startswith('s') else 'FP64'} FLOPs/cycle x {ghz:.2f} GHz ({clock_name}; the peak's derivation is in the header)"
        out.append(Check(cid, "compute", title, status, reason, fig, "GFLOPS", limit, basis, ratio, detail=detail))
    return out


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return gemm_checks(raw, result)


def spreads(gemm: dict[str, Any]) -> dict[str, list[float] | None]:
    """GFLOPS of each repeat: 2 n^3 FLOPs over its time."""
    out: dict[str, list[float] | None] = {}
    for key in ("dgemm_all", "dgemm_one", "sgemm_all", "sgemm_one"):
        times = (gemm.get(key) or {}).get("times_s") or []
        if gemm.get("n") and all(times):
            out[f"compute.{key}"] = span([2 * gemm["n"] ** 3 / t / 1e9 for t in times])
    return out
