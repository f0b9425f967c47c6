"""Single-row predict latency in-process: p50 reported, p99 against what an endpoint can afford.

Measured on the target (WORKERS, in the ML environment); judged on the control node, which
reads results.inference: p50_us, p99_us, p50_us_each, p99_us_each,
library, trees, depth, repeats, calls, threads.
"""

from __future__ import annotations

import time
from typing import Any

from ..base import FAIL, INFO, PASS, WARN, Check, _problem, span
from ..target.ml import _data, _env_default, _missing, median

NAME = "inference"
# The plan values whose change moves its figures: what the tuner may search (registry: KNOBS).
KNOBS: tuple[str, ...] = ("threads_per_job", "allocator")


# ---------------------------------------------------------------- target, ML environment

SIZES: dict[str, dict[str, Any]] = {
    "quick": {"infer_rows": 100_000, "infer_trees": 200, "infer_depth": 6, "infer_calls": 2000, "infer_repeats": 5},
    "full": {"infer_rows": 1_000_000, "infer_trees": 200, "infer_depth": 6, "infer_calls": 20_000, "infer_repeats": 5},
}


def w_inference(p: dict[str, Any]) -> dict[str, Any]:
    missing = _missing("xgboost", "gbdt")
    if missing:
        return missing
    import numpy as np
    import xgboost as xgb

    s = SIZES[p["profile"]]
    tuned = p["mode"] == "tuned"
    x, y = _data(s["infer_rows"], 28, seed=5)
    params = {"tree_method": "hist", "max_depth": s["infer_depth"], "objective": "binary:logistic"}
    booster = xgb.train(params, xgb.DMatrix(x, label=y), num_boost_round=s["infer_trees"])
    rows = x[:1000]
    for i in range(50):
        booster.inplace_predict(rows[i : i + 1])
    p50, p99 = [], []
    for _ in range(s["infer_repeats"]):
        lat = []
        for i in range(s["infer_calls"]):
            row = rows[i % 1000 : i % 1000 + 1]
            t0 = time.perf_counter()
            booster.inplace_predict(row)
            lat.append(time.perf_counter() - t0)
        us = np.array(lat) * 1e6
        p50.append(float(np.percentile(us, 50)))
        p99.append(float(np.percentile(us, 99)))
    return {
        "library": f"xgboost {xgb.__version__} inplace_predict",
        "trees": s["infer_trees"],
        "depth": s["infer_depth"],
        "calls": s["infer_calls"],
        "repeats": s["infer_repeats"],
        "threads": _env_default(tuned, "OMP_NUM_THREADS"),
        "p50_us": median(p50),
        "p99_us": median(p99),
        "p50_us_each": p50,
        "p99_us_each": p99,
    }


WORKERS = {"inference": w_inference}


# ---------------------------------------------------------------- control node

# Single-row predict: p99 within 2 ms passes (endpoints answer in 1-20 ms), within 10 ms warns.
LATENCY_P99_US = (2000.0, 10000.0)


def inference_checks(inf: dict[str, Any]) -> list[Check]:
    title = "single-row predict latency"
    problem = _problem("inference.p99", "inference", title, inf)
    if problem:
        return [problem]
    detail = (
        f"{inf['library']}, {inf['trees']} trees depth {inf['depth']}, median of {inf.get('repeats', 1)} x "
        f"{inf['calls']} calls, threads {inf['threads']}"
    )
    ok, warn = LATENCY_P99_US
    p99 = inf["p99_us"]
    status = PASS if p99 <= ok else WARN if p99 <= warn else FAIL
    basis = f"an endpoint answers in 1-20 ms: the model's p99 within {ok / 1000:.0f} ms passes, within {warn / 1000:.0f} ms warns"
    return [
        Check(
            "inference.p50",
            "inference",
            "single-row predict p50",
            INFO,
            "median latency in-process",
            inf["p50_us"],
            "µs",
            higher_is_better=False,
            detail=detail,
        ),
        Check(
            "inference.p99",
            "inference",
            "single-row predict p99",
            status,
            f"p99 {p99:,.0f} µs ({p99 / ok:.0%} of the budget)",
            p99,
            "µs",
            ok,
            basis,
            p99 / ok,
            higher_is_better=False,
            detail=detail,
        ),
    ]


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return inference_checks(result)


def spreads(inf: dict[str, Any]) -> dict[str, list[float] | None]:
    """The p50 and p99 of each repeat."""
    return {f"inference.{q}": span(inf[f"{q}_us_each"]) for q in ("p50", "p99") if inf.get(f"{q}_us_each")}
