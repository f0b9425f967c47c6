"""A feature pipeline in Polars (against its one-thread rate x the threads) and the same in pandas.

Runs on the control node. Reads results.features: rows, pipeline, polars {rows_per_s, threads,
times_s, version, result_rows}, polars_one {rows_per_s, error, skipped}, pandas {rows_per_s,
result_rows, version, times_s}; the raw result's mode, threads and plan.polars_threads.
"""

from __future__ import annotations

from typing import Any

from ..base import FAIL, INFO, Check, _problem, against_limit, span

NAME = "features"

# Polars' feature pipeline on all threads against its one-thread rate x the threads (joins and
# group-bys are memory-bound, like GBDT histograms).
FEATURES_GRADES = (0.3, 0.15)


def features_checks(raw: dict[str, Any], fe: dict[str, Any]) -> list[Check]:
    """The same feature pipeline in Polars (held against its one-thread rate x the threads) and in pandas."""
    group = "feature engineering"
    problem = _problem("features.polars", group, "Polars feature pipeline", fe)
    if problem:
        return [problem]
    pol, one = fe["polars"], fe.get("polars_one") or {}
    fig = pol["rows_per_s"] / 1e6
    threads = int(pol.get("threads") or 1)
    detail = (
        f"{fe['rows']:,} rows in memory: {fe['pipeline']}; median of {len(pol.get('times_s', []))}; polars {pol.get('version')}"
    )
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
    pd_ = fe.get("pandas")
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


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return features_checks(raw, result)


def spreads(fe: dict[str, Any]) -> dict[str, list[float] | None]:
    """M rows/s of each Polars run."""
    pol = fe.get("polars") or {}
    if pol.get("times_s") and all(pol["times_s"]):
        return {"features.polars": span([fe["rows"] / t / 1e6 for t in pol["times_s"]])}
    return {}
