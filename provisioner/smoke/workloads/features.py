"""A feature pipeline in Polars (against its one-thread rate x the threads) and the same in pandas.

Measured on the target (WORKERS, in the ML environment); judged on the control node, which
reads results.features: rows, pipeline, polars {rows_per_s, threads,
times_s, version, result_rows}, polars_one {rows_per_s, error, skipped}, pandas {rows_per_s,
result_rows, version, times_s}; the raw result's mode, threads and plan.polars_threads.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..base import FAIL, INFO, Check, Objective, _problem, against_limit, span
from ..target.ml import _env_default, _missing, median

NAME = "features"
# The plan values whose change moves its figures: what the tuner may search (registry: KNOBS).
KNOBS: tuple[str, ...] = ("polars_threads", "arrow_cpu_threads", "allocator")
# What `provisioner tune` optimises: the Polars pipeline's rows/s with the login shell's threads (no pandas run).
TUNE = Objective("rows/s", True, lambda r: float(r["polars"]["rows_per_s"]))


# ---------------------------------------------------------------- target, ML environment

SIZES: dict[str, dict[str, Any]] = {
    "quick": {"features_rows": 1_000_000, "features_repeats": 3},
    "full": {"features_rows": 20_000_000, "features_repeats": 5},
}


def _features_frame(rows: int):
    import numpy as np

    rng = np.random.default_rng(31)
    keys = 50_000
    return {
        "key": rng.integers(0, keys, rows, dtype=np.int32),
        "cat": rng.integers(0, 16, rows, dtype=np.int8),
        "x": rng.standard_normal(rows, dtype=np.float32),
        "y": rng.standard_normal(rows, dtype=np.float32),
        "t": np.arange(rows, dtype=np.int64),
    }, {"key": np.arange(keys, dtype=np.int32), "w": rng.standard_normal(keys, dtype=np.float32)}


def w_features(p: dict[str, Any]) -> dict[str, Any]:
    """One feature pipeline (filter, group-by aggregate, join, window) in Polars and in pandas over
    the same in-memory frame: rows/s of each. Polars' threads are fixed at import: set them first."""
    for module in ("polars", "pandas"):
        missing = _missing(module, "core")
        if missing:
            return missing
    tuned = p["mode"] == "tuned"
    if p.get("polars_threads"):
        threads, how = int(p["polars_threads"]), "one thread (the scaling run)"
    else:
        # Tuned: the login shell's POLARS_MAX_THREADS as a user's code gets it (the check holds
        # Polars' pool to the plan); baseline: no variable, the library default.
        threads, how = None, _env_default(tuned, "POLARS_MAX_THREADS")
    if threads:
        os.environ["POLARS_MAX_THREADS"] = str(threads)
    elif not tuned:
        os.environ.pop("POLARS_MAX_THREADS", None)
    import polars as pl

    s = SIZES[p["profile"]]
    rows = s["features_rows"]
    cols, dim_cols = _features_frame(rows)
    df, dim = pl.DataFrame(cols), pl.DataFrame(dim_cols)

    def polars_once() -> tuple[int, float]:
        kept = df.lazy().filter(pl.col("x") > -0.5)
        agg = kept.group_by("key").agg(pl.col("x").mean().alias("x_mean"), pl.col("y").sum().alias("y_sum"), pl.len().alias("n"))
        out = (
            kept.join(agg, on="key", how="left")
            .join(dim.lazy(), on="key", how="left")
            .sort("t")
            .with_columns(
                (pl.col("y") * pl.col("w")).cum_sum().over("key").alias("y_cum"), (pl.col("x") - pl.col("x_mean")).alias("x_dev")
            )
            .collect()
        )
        return out.height, float(out["y_cum"].sum())

    def timed(fn) -> tuple[list[float], Any]:
        got = fn()  # warm: allocator, caches, the thread pool
        times = []
        for _ in range(s["features_repeats"]):
            t0 = time.perf_counter()
            got = fn()
            times.append(time.perf_counter() - t0)
        return times, got

    times, got = timed(polars_once)
    result: dict[str, Any] = {
        "rows": rows,
        "repeats": s["features_repeats"],
        "pipeline": "filter, group-by aggregate (mean, sum, count), two joins, window (cumulative sum over key, deviation from the key's mean)",
        "polars": {
            "version": pl.__version__,
            "threads": pl.thread_pool_size(),
            "threads_how": how,
            "times_s": times,
            "rows_per_s": rows / median(times),
            "result_rows": got[0],
            "checksum": got[1],
        },
    }
    if p.get("pandas", True) and not p.get("tune"):
        import pandas as pd

        pdf, pdim = pd.DataFrame(cols), pd.DataFrame(dim_cols)

        def pandas_once() -> tuple[int, float]:
            kept = pdf[pdf["x"] > -0.5]
            agg = kept.groupby("key", as_index=False).agg(x_mean=("x", "mean"), y_sum=("y", "sum"), n=("y", "size"))
            out = kept.merge(agg, on="key", how="left").merge(pdim, on="key", how="left").sort_values("t")
            out["y_cum"] = (out["y"] * out["w"]).groupby(out["key"]).cumsum()
            out["x_dev"] = out["x"] - out["x_mean"]
            return len(out), float(out["y_cum"].sum())

        ptimes, pgot = timed(pandas_once)
        result["pandas"] = {
            "version": pd.__version__,
            "threads": 1,
            "times_s": ptimes,
            "rows_per_s": rows / median(ptimes),
            "result_rows": pgot[0],
            "checksum": pgot[1],
        }
    return result


WORKERS = {"features": w_features}


# ---------------------------------------------------------------- target, root parent (stdlib)


def drive(runner: Any) -> dict[str, Any]:
    """The feature pipeline in Polars (planned threads) and pandas, then Polars again on one thread:
    Polars sizes its pool once, when it is imported, so each thread count is a process of its own."""
    allc = runner.worker("features")
    if "error" in allc or "skipped" in allc:
        return allc
    one = runner.worker("features", polars_threads=1, pandas=False)
    if "error" in one or "skipped" in one:
        return {**allc, "polars_one": one}
    return {**allc, "polars_one": one["polars"]}


# ---------------------------------------------------------------- control node

# Polars' feature pipeline on all threads against its one-thread rate x the threads (joins and
# group-bys are memory-bound, like GBDT histograms).
FEATURES_GRADES = (0.3, 0.15)


def features_checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    """The same feature pipeline in Polars (held against its one-thread rate x the threads) and in pandas."""
    group = "feature engineering"
    problem = _problem("features.polars", group, "Polars feature pipeline", result)
    if problem:
        return [problem]
    pol, one = result["polars"], result.get("polars_one") or {}
    fig = pol["rows_per_s"] / 1e6
    threads = int(pol.get("threads") or 1)
    detail = f"{result['rows']:,} rows in memory: {result['pipeline']}; median of {len(pol.get('times_s', []))}; polars {pol.get('version')}"
    out = []
    if "rows_per_s" in one and threads > 1:
        limit = one["rows_per_s"] * threads / 1e6
        ratio = fig / limit
        reason = f"1 -> {threads} threads: {pol['rows_per_s'] / one['rows_per_s']:.2f}x ({ratio:.0%} of linear)"
        status, reason = against_limit(
            ratio,
            FEATURES_GRADES,
            reason,
            "the one-thread run",
            "more threads barely help: POLARS_MAX_THREADS below the cores, or other work on them",
        )
        basis = f"Polars on one thread ({one['rows_per_s'] / 1e6:.3g} M rows/s, POLARS_MAX_THREADS=1) x {threads} threads"
        check = Check(
            "features.polars",
            group,
            "Polars feature pipeline",
            status,
            reason,
            fig,
            "M rows/s",
            limit,
            basis,
            ratio,
            detail=detail,
        )
    else:
        why = one.get("error") or one.get("skipped") or f"{threads} thread: nothing to scale"
        check = Check(
            "features.polars",
            group,
            "Polars feature pipeline",
            INFO,
            f"reported without a limit: {why}",
            fig,
            "M rows/s",
            detail=detail,
        )
    want = (raw.get("plan") or {}).get("polars_threads") or raw.get("threads")
    if raw.get("mode") == "tuned" and want and threads != int(want):
        check.status = FAIL
        check.reason = f"Polars runs {threads} threads, the plan says {want} (POLARS_MAX_THREADS); " + check.reason
    out.append(check)
    pd_ = result.get("pandas")
    if pd_:
        same = pd_.get("result_rows") == pol.get("result_rows")
        out.append(
            Check(
                "features.pandas",
                group,
                "pandas feature pipeline (one thread)",
                INFO if same else FAIL,
                f"Polars is {pol['rows_per_s'] / pd_['rows_per_s']:.1f}x pandas on the same pipeline"
                if same
                else f"pandas kept {pd_.get('result_rows'):,} rows, Polars {pol.get('result_rows'):,}: the pipelines differ",
                pd_["rows_per_s"] / 1e6,
                "M rows/s",
                detail=f"pandas {pd_.get('version')}, median of {len(pd_.get('times_s', []))}",
            )
        )
    return out


checks = features_checks


def spreads(fe: dict[str, Any]) -> dict[str, list[float] | None]:
    """M rows/s of each Polars run."""
    pol = fe.get("polars") or {}
    if pol.get("times_s") and all(pol["times_s"]):
        return {"features.polars": span([fe["rows"] / t / 1e6 for t in pol["times_s"]])}
    return {}
