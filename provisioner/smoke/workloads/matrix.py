"""The in-RAM feature matrix: held without a page swapped out, and a cross-validation over it at
the rate of the host's SGEMM.

Measured on the target (WORKERS, in the ML environment); judged on the control node, which
reads results.matrix: bytes, planned_bytes, planned_rows,
planned_from_plan, features, rows, rows_how, swapped_out_pages, r2, build_gbps, max_rss_bytes,
cv_gflops, sgemm_gflops, folds, cv_s, how, threads.
"""

from __future__ import annotations

import re
import time
from typing import Any

from ..base import FAIL, PASS, Check, _problem, against_limit, number
from ..target.ml import _blas_threads, median
from ..target.probe import read

NAME = "matrix"
# The plan values whose change moves its figures: what the tuner may search (registry: KNOBS).
KNOBS: tuple[str, ...] = ("feature_matrix_rows", "threads_per_job", "thp_enabled")


# ---------------------------------------------------------------- target, ML environment

SIZES: dict[str, dict[str, Any]] = {
    "quick": {"matrix_share": None, "matrix_rows": 200_000, "matrix_folds": 4},
    "full": {"matrix_share": 0.5, "matrix_rows": None, "matrix_folds": 5},
}


def _sgemm_rate(n: int = 2048, repeats: int = 3) -> float:
    """numpy's float32 GEMM rate in GFLOPS with the BLAS threads in force now."""
    import numpy as np

    a = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(2).standard_normal((n, n), dtype=np.float32)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / median(times) / 1e9


def _meminfo() -> dict[str, int]:
    out = {}
    for line in (read("/proc/meminfo", "") or "").splitlines():
        name, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            out[name] = int(rest.split()[0]) * 1024
    return out


def _swapped_out() -> int:
    m = re.search(r"^pswpout (\d+)$", read("/proc/vmstat", "") or "", re.M)
    return int(m.group(1)) if m else 0


MATRIX_FEATURES = 200  # the plan's default width (plan_feature_matrix_features)


MATRIX_MARGIN = 0.5  # without a plan: half of what is available now, for the rest of the job and the OS


def w_matrix(p: dict[str, Any]) -> dict[str, Any]:
    """The in-RAM feature matrix: build a float32 rows x features matrix once, then a K-fold
    cross-validation of ridge regression over it without reloading or copying it (each fold a
    contiguous view; a fold's training Gram matrix is the total minus its own)."""
    import resource

    import numpy as np

    s = SIZES[p["profile"]]
    tuned = p["mode"] == "tuned"
    plan = p.get("plan") or {}
    features = int(plan.get("feature_matrix_features") or MATRIX_FEATURES)
    mem = _meminfo()
    if plan.get("feature_matrix_rows"):
        planned, whose = int(plan["feature_matrix_rows"]), "the plan's feature_matrix_rows"
    else:  # the largest one by a safe rule of its own: half of what is available now
        planned = int(mem.get("MemAvailable", 0) * MATRIX_MARGIN / (4 * (features + 1)))
        whose = f"{MATRIX_MARGIN:.0%} of MemAvailable over {4 * (features + 1)} B a row (the plan has no feature_matrix_rows)"
    if s["matrix_rows"]:  # quick: a small one
        rows, how = min(int(s["matrix_rows"]), planned), f"the quick profile's {s['matrix_rows']:,} rows; largest: {whose}"
    else:
        rows, how = int(planned * s["matrix_share"]), f"{s['matrix_share']:.0%} of {whose}"
    folds = s["matrix_folds"]
    rows -= rows % folds
    swap0 = _swapped_out()
    # No limit: the BLAS threads the environment gives (role thread_env), read here.
    threads = _blas_threads() if tuned else None
    sgemm = _sgemm_rate(2048 if p["profile"] == "quick" else 4096)
    t0 = time.perf_counter()
    x = np.empty((rows, features), dtype=np.float32)
    y = np.empty(rows, dtype=np.float32)
    rng = np.random.default_rng(41)
    w = rng.standard_normal(features).astype(np.float32)
    chunk = max(1, (64 << 20) // (4 * features))
    for i in range(0, rows, chunk):
        block = x[i : i + chunk]
        rng.standard_normal(out=block, dtype=np.float32)
        np.matmul(block, w, out=y[i : i + chunk])
        y[i : i + chunk] += rng.standard_normal(len(block), dtype=np.float32)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    size = rows // folds
    grams, xty = [], []
    for k in range(folds):
        xk, yk = x[k * size : (k + 1) * size], y[k * size : (k + 1) * size]  # views, no copy
        grams.append((xk.T @ xk).astype(np.float64))
        xty.append((xk.T @ yk).astype(np.float64))
    total_g, total_b = sum(grams), sum(xty)
    sse = sst = 0.0
    lam = 1.0 * rows / folds
    for k in range(folds):
        coef = np.linalg.solve(total_g - grams[k] + lam * np.eye(features), total_b - xty[k])
        xk, yk = x[k * size : (k + 1) * size], y[k * size : (k + 1) * size]
        resid = yk - xk @ coef.astype(np.float32)
        sse += float(resid @ resid)
        sst += float(((yk - yk.mean()) ** 2).sum())
    cv_s = time.perf_counter() - t0
    flops = 2.0 * rows * features * features + 2.0 * rows * features * 2
    return {
        "rows": rows,
        "features": features,
        "bytes": x.nbytes + y.nbytes,
        "rows_how": how,
        "planned_rows": planned,
        "planned_bytes": plan.get("feature_matrix_bytes") or planned * features * 4,
        "planned_from_plan": bool(plan.get("feature_matrix_rows")),
        "folds": folds,
        "threads": threads or "library default",
        "build_s": build_s,
        "build_gbps": (x.nbytes + y.nbytes) / build_s / 1e9,
        "cv_s": cv_s,
        "cv_gflops": flops / cv_s / 1e9,
        "sgemm_gflops": sgemm,
        "r2": 1 - sse / sst if sst else None,
        "mem_available_before": mem.get("MemAvailable"),
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "swapped_out_pages": _swapped_out() - swap0,
        "how": "ridge regression, K folds as contiguous row views; per-fold Gram matrices once, each fold's "
        "training Gram = total - its own: one pass over the matrix, no copy",
    }


WORKERS = {"matrix": w_matrix}


# ---------------------------------------------------------------- control node

# Cross-validation over the in-RAM feature matrix: its Gram matrices are GEMMs.
MATRIX_GRADES = (0.4, 0.2)


def matrix_checks(raw: dict[str, Any], mx: dict[str, Any]) -> list[Check]:
    """The in-RAM feature matrix: held in memory without a page swapped out, and a cross-validation
    over it at the rate of the host's SGEMM."""
    group = "feature matrix"
    problem = _problem("matrix.cv", group, "cross-validation over the feature matrix", mx)
    if problem:
        return [problem]
    out = []
    gb = mx["bytes"] / 1e9
    planned_bytes = mx.get("planned_bytes") or (mx["planned_rows"] * mx["features"] * 4 if mx.get("planned_rows") else None)
    limit = planned_bytes / 1e9 if planned_bytes else None
    swapped = int(mx.get("swapped_out_pages") or 0)
    r2 = mx.get("r2")
    if swapped:
        status, reason = FAIL, f"{swapped:,} pages swapped out while the matrix was held: it does not fit beside the rest"
    elif r2 is None or r2 < 0.5:
        status, reason = FAIL, f"the cross-validation's R² is {r2}: the folds were not computed over the matrix built"
    else:
        status, reason = PASS, f"{mx['rows']:,} x {mx['features']} float32 held and cross-validated, no page swapped out"
    if not limit:
        basis = ""
    elif mx.get("planned_from_plan", True):
        basis = f"the plan's largest matrix this host holds without swapping ({number(limit)} GB)"
    else:
        basis = f"the largest matrix by the workload's own rule ({number(limit)} GB): the plan has no feature_matrix_rows"
    out.append(
        Check(
            "matrix.memory",
            group,
            "feature matrix held in RAM",
            status,
            reason,
            gb,
            "GB",
            limit,
            basis,
            gb / limit if limit else None,
            detail=f"{mx['rows_how']}; built at {mx['build_gbps']:.2f} GB/s; peak RSS {mx['max_rss_bytes'] / 1e9:.2f} GB",
        )
    )
    ratio = mx["cv_gflops"] / mx["sgemm_gflops"]
    reason = f"{ratio:.0%} of the SGEMM rate, {mx['folds']} folds in {mx['cv_s']:.2f} s (R² {r2 if r2 is None else round(r2, 3)})"
    status, reason = against_limit(
        ratio,
        MATRIX_GRADES,
        reason,
        "the SGEMM rate",
        "the Gram matrices are GEMMs: check the BLAS kernel and the thread count",
    )
    out.append(
        Check(
            "matrix.cv",
            group,
            "cross-validation over the feature matrix",
            status,
            reason,
            mx["cv_gflops"],
            "GFLOPS",
            mx["sgemm_gflops"],
            "numpy SGEMM n=2048 in the same process, same threads",
            ratio,
            detail=f"{mx['how']}; threads {mx['threads']}",
        )
    )
    return out


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return matrix_checks(raw, result)
