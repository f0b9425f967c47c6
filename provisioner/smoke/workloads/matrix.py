"""The in-RAM feature matrix: held without a page swapped out, and a cross-validation over it at
the rate of the host's SGEMM.

Runs on the control node. Reads results.matrix: bytes, planned_bytes, planned_rows,
planned_from_plan, features, rows, rows_how, swapped_out_pages, r2, build_gbps, max_rss_bytes,
cv_gflops, sgemm_gflops, folds, cv_s, how, threads.
"""

from __future__ import annotations

from typing import Any

from ..base import FAIL, PASS, Check, _problem, against_limit, number

NAME = "matrix"

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
