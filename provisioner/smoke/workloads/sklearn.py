"""scikit-learn: RandomForest scaling against linear, GridSearchCV on loky workers against the same
search one fit after another, and the BLAS threads inside each worker.

Runs on the control node. Reads results.sklearn: rows, trees, sklearn, forest {all, one:
{row_trees_per_s, n_jobs, times_s}}, grid {n_jobs, n_jobs_how, candidates, folds,
sequential_per_min, parallel_per_min, estimator, rows, share, workers_seen}; the raw result's
mode and threads.
"""

from __future__ import annotations

from typing import Any

from ..base import FAIL, INFO, PASS, SKIP, Check, _problem, against_limit, span

NAME = "sklearn"

# RandomForest trees are independent: all cores should reach half of the one-core fit x cores.
SKLEARN_FOREST_GRADES = (0.5, 0.25)
# GridSearchCV on loky workers against the same search one fit after another, x the workers.
SKLEARN_GRID_GRADES = (0.5, 0.25)


def sklearn_checks(raw: dict[str, Any], sk: dict[str, Any]) -> list[Check]:
    """RandomForest scaling against linear, GridSearchCV on loky workers against the same search
    run one fit after another, and the BLAS threads each worker had (over its share fails)."""
    group = "scikit-learn"
    problem = _problem("sklearn.forest", group, "RandomForest fit", sk)
    if problem:
        return [problem]
    tuned = raw.get("mode") == "tuned"
    cores = int(raw.get("threads") or 1)
    out = []
    forest = sk["forest"]
    fig, one = forest["all"]["row_trees_per_s"] / 1e6, forest["one"]["row_trees_per_s"] / 1e6
    limit = one * cores
    ratio = fig / limit
    reason = f"n_jobs {forest['all']['n_jobs']}: 1 -> {cores} cores {fig / one:.1f}x ({ratio:.0%} of linear)"
    status, reason = against_limit(
        ratio,
        SKLEARN_FOREST_GRADES,
        reason,
        "the one-core fit",
        "the trees are independent, so n_jobs below the cores or threads fighting over them",
    )
    out.append(
        Check(
            "sklearn.forest",
            group,
            "RandomForest fit, all cores",
            status,
            reason,
            fig,
            "M row-trees/s",
            limit,
            f"the one-core fit ({one:.3g} M row-trees/s, n_jobs=1) x {cores} cores (linear: trees are independent)",
            ratio,
            detail=f"{sk['rows']:,} x 20, {sk['trees']} trees depth 12, median of {len(forest['all']['times_s'])}; "
            f"scikit-learn {sk.get('sklearn')}",
        )
    )
    g = sk["grid"]
    workers = g["n_jobs"] if isinstance(g["n_jobs"], int) else 1
    limit = g["sequential_per_min"] * min(workers, g["candidates"] * g["folds"])
    ratio = g["parallel_per_min"] / limit
    reason = (
        f"n_jobs {g['n_jobs']} ({g['n_jobs_how']}): {g['parallel_per_min'] / g['sequential_per_min']:.2f}x "
        f"the sequential search ({ratio:.0%} of linear)"
    )
    status, reason = against_limit(
        ratio,
        SKLEARN_GRID_GRADES,
        reason,
        "the sequential search",
        "parallel fits lose to sequential ones: each loky worker's BLAS threads must be cores / n_jobs",
    )
    out.append(
        Check(
            "sklearn.grid",
            group,
            "GridSearchCV candidates/min",
            status,
            reason,
            g["parallel_per_min"],
            "candidates/min",
            limit,
            f"the same search with n_jobs=1 and {cores} BLAS threads ({g['sequential_per_min']:.3g}/min) x {workers} workers",
            ratio,
            detail=f"{g['estimator']}, {g['candidates']} candidates x {g['folds']} folds on {g['rows']:,} rows",
        )
    )
    seen = [w for w in g.get("workers_seen") or [] if not w.get("main")]
    title = "BLAS threads inside the loky workers"
    if not seen:
        out.append(
            Check(
                "sklearn.threads",
                group,
                title,
                INFO if not tuned else SKIP,
                "no loky worker scored: the search ran in the main process (one job)",
            )
        )
        return out
    most = max((max(w["blas"] + w["openmp"], default=0) for w in seen), default=0)
    share = g.get("share")
    shown = "; ".join(f"pid {w['pid']}: BLAS {w['blas'] or 'none'}, OpenMP {w['openmp'] or 'none'}" for w in seen)
    if not tuned or not share:
        out.append(
            Check(
                "sklearn.threads",
                group,
                title,
                INFO,
                f"at most {most} thread(s) per pool in {len(seen)} worker(s) with library defaults",
                float(most),
                "threads",
                detail=shown,
            )
        )
        return out
    over = [w for w in seen if max(w["blas"] + w["openmp"], default=0) > share]
    if over:
        status = FAIL
        reason = (
            f"oversubscribed: {len(over)} of {len(seen)} worker(s) run up to {most} BLAS/OpenMP threads, "
            f"their share is {share} ({cores} cores / {workers} workers); {workers} x {most} threads on {cores} cores"
            "; a plain search gets the share only through the ML environment's start-up hook with the environment's "
            "PROVISIONER_THREADS: run provisioner up --tags mlstack,thread_env"
        )
    else:
        status, reason = PASS, f"{len(seen)} worker(s), at most {most} thread(s) each: within the share of {share}"
    out.append(
        Check(
            "sklearn.threads",
            group,
            title,
            status,
            reason,
            float(most),
            "threads",
            float(share),
            f"{cores} cores / {workers} loky workers (threadpoolctl read inside each worker while it scored)",
            most / share,
            higher_is_better=False,
            detail=shown,
        )
    )
    return out


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return sklearn_checks(raw, result)


def spreads(sk: dict[str, Any]) -> dict[str, list[float] | None]:
    """M row-trees/s of each all-core forest fit."""
    forest = (sk.get("forest") or {}).get("all") or {}
    if forest.get("times_s") and all(forest["times_s"]):
        return {"sklearn.forest": span([sk["rows"] * sk["trees"] / t / 1e6 for t in forest["times_s"]])}
    return {}
