"""Gradient boosting (XGBoost, LightGBM, CatBoost hist training): the all-core rate against the one-core rate x the cores.

Measured on the target (WORKERS, in the ML environment); judged on the control node, which
reads results.gbdt: rows, cols, depth and per library
{all, one: {row_trees_per_s, trees, threads, times_s}, version} (or skipped/error); the raw
result's threads.
"""

from __future__ import annotations

import time
from typing import Any

from ..base import Check, _problem, linear_scaling
from ..target.ml import _data, _env_default, _missing, median

NAME = "gbdt"
# The plan values whose change moves its figures: what the tuner may search (registry: KNOBS).
KNOBS: tuple[str, ...] = ("threads_per_job", "omp_proc_bind", "kmp_blocktime", "allocator")


# ---------------------------------------------------------------- target, ML environment

# gbdt_rows: at most; gbdt_rows() gives each thread 125,000 of them.
SIZES: dict[str, dict[str, Any]] = {
    "quick": {
        "gbdt_rows": 1_000_000,
        "gbdt_cols": 28,
        "gbdt_depth": 8,
        "gbdt_trees": 100,
        "gbdt_trees_one": 20,
        "gbdt_repeats": 1,
    },
    "full": {
        "gbdt_rows": 10_000_000,
        "gbdt_cols": 28,
        "gbdt_depth": 10,
        "gbdt_trees": 100,
        "gbdt_trees_one": 100,
        "gbdt_repeats": 3,
    },
}


def _train(lib: str, x, y, trees: int, depth: int, threads: int | None) -> tuple[float, float]:
    """Train `trees` hist trees of `depth` with `threads` (None: library default).

    Returns (seconds in total, seconds per tree after the first): the first tree carries
    one-off setup (histogram buffers, row partitions), which would flatter a longer run.
    """
    marks: list[float] = []
    if lib == "xgboost":
        import xgboost as xgb

        class Mark(xgb.callback.TrainingCallback):
            def after_iteration(self, model, epoch, evals_log) -> bool:
                marks.append(time.perf_counter())
                return False

        params = {"tree_method": "hist", "max_depth": depth, "objective": "binary:logistic", "max_bin": 256}
        if threads:
            params["nthread"] = threads
        # quantile cuts computed here, outside the timing, as LightGBM's and CatBoost's binning is
        d = xgb.QuantileDMatrix(x, label=y, max_bin=256, **({"nthread": threads} if threads else {}))
        t0 = time.perf_counter()
        xgb.train(params, d, num_boost_round=trees, callbacks=[Mark()])
    elif lib == "lightgbm":
        import lightgbm as lgb

        params = {
            "objective": "binary",
            "num_leaves": 2**depth - 1,
            "max_depth": depth,
            "verbose": -1,
            "max_bin": 255,
            "force_col_wise": True,
        }
        if threads:
            params["num_threads"] = threads
        ds = lgb.Dataset(x, label=y, params={"verbose": -1, "max_bin": 255})
        ds.construct()
        t0 = time.perf_counter()
        lgb.train(params, ds, num_boost_round=trees, callbacks=[lambda env: marks.append(time.perf_counter())])
    else:
        import catboost as cb

        class CbMark:
            def after_iteration(self, info) -> bool:
                marks.append(time.perf_counter())
                return True

        pool = cb.Pool(x, label=y)
        pool.quantize(border_count=254)
        model = cb.CatBoostClassifier(
            iterations=trees,
            depth=depth,
            verbose=False,
            allow_writing_files=False,
            **({"thread_count": threads} if threads else {}),
        )
        t0 = time.perf_counter()
        model.fit(pool, callbacks=[CbMark()])
    total = time.perf_counter() - t0
    per_tree = (marks[-1] - marks[0]) / (len(marks) - 1) if len(marks) > 1 else total / trees
    return total, per_tree


def gbdt_rows(profile: str, threads: int) -> int:
    """The training rows: quick gives each thread the same share (125,000 rows), from 250,000
    to the profile's 1,000,000, so the fits take seconds on 2 cores as on 32; full is fixed."""
    s = SIZES[profile]
    if profile != "quick":
        return s["gbdt_rows"]
    return max(250_000, min(s["gbdt_rows"], 125_000 * max(1, threads)))


def w_gbdt(p: dict[str, Any]) -> dict[str, Any]:
    s = SIZES[p["profile"]]
    tuned = p["mode"] == "tuned"
    rows = gbdt_rows(p["profile"], int(p["threads"] or 1))
    x, y = _data(rows, s["gbdt_cols"])
    out: dict[str, Any] = {"rows": rows, "cols": s["gbdt_cols"], "depth": s["gbdt_depth"]}
    for lib in ("xgboost", "lightgbm", "catboost"):
        missing = _missing(lib, "gbdt")
        if missing:
            out[lib] = missing
            continue
        res: dict[str, Any] = {"version": __import__(lib).__version__}
        for label, threads, trees in (("all", None, s["gbdt_trees"]), ("one", 1, s["gbdt_trees_one"])):
            runs = [_train(lib, x, y, trees, s["gbdt_depth"], threads) for _ in range(s["gbdt_repeats"])]
            res[label] = {
                "trees": trees,
                "threads": threads or _env_default(tuned, "OMP_NUM_THREADS"),
                "times_s": [r[0] for r in runs],
                "row_trees_per_s": rows / median([r[1] for r in runs]),
                "row_trees_per_s_with_setup": rows * trees / median([r[0] for r in runs]),
            }
        out[lib] = res
    return out


WORKERS = {"gbdt": w_gbdt}


# ---------------------------------------------------------------- control node

GBDT_GRADES = (0.3, 0.15)  # 1 -> 16 cores: only 5-7x (memory-bound); below 0.15 extra threads are wasted


def gbdt_checks(raw: dict[str, Any], gbdt: dict[str, Any]) -> list[Check]:
    problem = _problem("gbdt", "gradient boosting", "gradient boosting", gbdt)
    if problem:
        return [problem]
    out = []
    for lib in ("xgboost", "lightgbm", "catboost"):
        res = gbdt.get(lib) or {}
        cid, title = f"gbdt.{lib}", f"{lib} hist training"
        problem = _problem(cid, "gradient boosting", title, res)
        if problem:
            out.append(problem)
            continue
        allc, one = res["all"], res["one"]
        cores = int(raw.get("threads") or 1)
        fig, limit, ratio, status, reason = linear_scaling(allc["row_trees_per_s"], one["row_trees_per_s"], cores, GBDT_GRADES)
        detail = (
            f"{gbdt.get('rows'):,} x {gbdt.get('cols')}, depth {gbdt.get('depth')}, {allc['trees']} trees on "
            f"{allc['threads']} threads, {one['trees']} on 1; median of {len(allc.get('times_s', []))}; "
            f"{lib} {res.get('version')}"
        )
        basis = f"the one-core rate ({one['row_trees_per_s'] / 1e6:.2f} M row-trees/s) x {cores} cores (linear scaling)"
        out.append(
            Check(cid, "gradient boosting", title, status, reason, fig, "M row-trees/s", limit, basis, ratio, detail=detail)
        )
    return out


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return gbdt_checks(raw, result)
