"""scikit-learn: RandomForest scaling against linear, GridSearchCV on loky workers against the same
search one fit after another, and the BLAS threads inside each worker.

Measured on the target (WORKERS, in the ML environment); judged on the control node, which
reads results.sklearn: rows, trees, sklearn, forest {all, one:
{row_trees_per_s, n_jobs, times_s}}, grid {n_jobs, n_jobs_how, candidates, folds,
sequential_per_min, parallel_per_min, estimator, rows, share, workers_seen}; the raw result's
mode and threads.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ..base import FAIL, INFO, PASS, SKIP, Check, Objective, _problem, against_limit, span
from ..target.ml import _data, _missing, _planned, median

NAME = "sklearn"
# The plan values whose change moves its figures: what the tuner may search (registry: KNOBS).
KNOBS: tuple[str, ...] = ("joblib_workers", "threads_per_job")
# What `provisioner tune` optimises: a user's plain n_jobs=-1 twice, a RandomForest fit and a GridSearchCV
# (both take loky's cpu_count(), which the environment's LOKY_MAX_CPU_COUNT caps): the geometric mean of the
# fit's row-trees/s and the search's candidates/min, so a value that speeds one by slowing the other is
# not kept. No one-core fit, no sequential search.
TUNE = Objective(
    "geometric mean of forest row-trees/s and grid candidates/min",
    True,
    lambda r: (float(r["forest"]["all"]["row_trees_per_s"]) * float(r["grid"]["parallel_per_min"])) ** 0.5,
)


# ---------------------------------------------------------------- target, ML environment

SIZES: dict[str, dict[str, Any]] = {
    "quick": {
        "sklearn_rows": 20_000,
        "sklearn_trees": 20,
        "sklearn_grid_rows": 10_000,
        "sklearn_grid_iter": 5,
        "sklearn_folds": 3,
    },
    "full": {
        "sklearn_rows": 200_000,
        "sklearn_trees": 100,
        "sklearn_grid_rows": 100_000,
        "sklearn_grid_iter": 20,
        "sklearn_folds": 5,
    },
}


def _record_threads(path: str):
    """A GridSearchCV scorer that, inside whichever process scores, writes that process's thread pools
    (threadpoolctl) to `path`-PID.json, then returns the accuracy."""

    def scorer(estimator, x, y) -> float:
        from threadpoolctl import threadpool_info

        pools = [
            {"user_api": i.get("user_api"), "internal_api": i.get("internal_api"), "num_threads": i.get("num_threads")}
            for i in threadpool_info()
        ]
        with open(f"{path}-{os.getpid()}.json", "w", encoding="utf-8") as f:
            json.dump({"pid": os.getpid(), "pools": pools}, f)
        return float((estimator.predict(x) == y).mean())

    return scorer


def _warm_worker() -> int:
    """One loky worker as a long search leaves it: the search's modules imported and a first fit done. It
    holds the worker half a second, so every worker of the pool takes one warm-up of its own."""
    import warnings

    import threadpoolctl  # noqa: F401  (the search's scorer reads the pools with it)
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.model_selection import GridSearchCV  # noqa: F401  (its fit and score helpers)
    from sklearn.neural_network import MLPClassifier

    warnings.filterwarnings("ignore", category=ConvergenceWarning)
    x, y = _data(64, 64, seed=22)
    MLPClassifier(hidden_layer_sizes=(8,), max_iter=1, random_state=0).fit(x, y)
    time.sleep(0.5)
    return os.getpid()


def w_sklearn(p: dict[str, Any]) -> dict[str, Any]:
    """scikit-learn: a RandomForest fit on all cores against one, and a GridSearchCV on the planned
    loky workers against the same search run sequentially, with every worker's BLAS threads read
    inside the worker (threadpoolctl)."""
    missing = _missing("sklearn", "core")
    if missing:
        return missing
    import glob
    import warnings

    import sklearn
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.model_selection import GridSearchCV
    from sklearn.neural_network import MLPClassifier

    warnings.filterwarnings("ignore", category=ConvergenceWarning)
    s = SIZES[p["profile"]]
    tuned = p["mode"] == "tuned"
    cores = p["threads"]
    x, y = _data(s["sklearn_rows"], 20, seed=21)
    out: dict[str, Any] = {"sklearn": sklearn.__version__, "rows": s["sklearn_rows"], "trees": s["sklearn_trees"]}

    forest: dict[str, Any] = {}
    # All cores as a user asks for them (n_jobs=-1: loky's cpu_count(), which LOKY_MAX_CPU_COUNT caps).
    # Tune measures the all-core fit only: LOKY_MAX_CPU_COUNT moves it as it moves the search's workers.
    for label, jobs in (("all", -1),) if p.get("tune") else (("all", -1 if tuned else None), ("one", 1)):
        times = []
        for _ in range(2):
            model = RandomForestClassifier(n_estimators=s["sklearn_trees"], max_depth=12, n_jobs=jobs, random_state=0)
            t0 = time.perf_counter()
            model.fit(x, y)
            times.append(time.perf_counter() - t0)
        forest[label] = {
            "n_jobs": jobs or "library default (None: one)",
            "times_s": times,
            "row_trees_per_s": s["sklearn_rows"] * s["sklearn_trees"] / median(times),
        }
    out["forest"] = forest

    if p.get("tune"):
        from joblib import cpu_count

        workers, how = cpu_count(), "n_jobs=-1: loky's cpu_count() under the environment's LOKY_MAX_CPU_COUNT"
    else:
        workers, how = _planned(p, "joblib_workers", cores, "the physical cores")
    gx, gy = _data(s["sklearn_grid_rows"], 64, seed=22)
    grid: dict[str, list[Any]] = {"hidden_layer_sizes": [(64,), (128,)], "alpha": [1e-4, 1e-2]}
    fits = len(grid["hidden_layer_sizes"]) * len(grid["alpha"]) * s["sklearn_folds"]
    record = os.path.join(p["workdir"], "sklearn-threads")
    base = MLPClassifier(max_iter=s["sklearn_grid_iter"], random_state=0)

    # The share each loky worker must stay within: cores // n_jobs. The search is a user's plain
    # code (no inner_max_num_threads, no threadpool_limits): what the workers run is what the
    # environment gives them (joblib keeps a thread variable it finds in the environment; the ML
    # environment's start-up hook gives each worker its share), read inside each worker.
    share = max(1, cores // workers) if tuned else None

    def search(n_jobs: int | None, rows: int | None = None) -> float:
        gs = GridSearchCV(base, grid, cv=s["sklearn_folds"], n_jobs=n_jobs, scoring=_record_threads(record), refit=False)
        t0 = time.perf_counter()
        gs.fit(gx[:rows], gy[:rows])
        return time.perf_counter() - t0

    # loky's workers start once and stay for the next call, and a long search pays their imports of the
    # estimator's modules once: both before the clock. Else the quick size's short fits timed the workers'
    # imports: 0.68x the sequential search on a first call here, 1.33x on the next, 1.5-1.8x with fits
    # ten times longer. Every worker gets a warm-up of its own (a search has fewer fits than a large
    # host has workers), then the same search runs over a few rows (in this process too, for n_jobs=1).
    if tuned and workers > 1:
        from joblib import Parallel, delayed

        Parallel(n_jobs=workers)(delayed(_warm_worker)() for _ in range(workers))
    search(workers if tuned else None, rows=300)
    for f in glob.glob(record + "-*.json"):
        os.remove(f)
    par_s = search(workers if tuned else None)
    seen = []
    for f in sorted(glob.glob(record + "-*.json")):
        with open(f, encoding="utf-8") as fh:
            seen.append(json.load(fh))
        os.remove(f)
    seq_s = float("nan") if p.get("tune") else search(1)
    candidates = fits // s["sklearn_folds"]
    out["grid"] = {
        "estimator": f"MLPClassifier(max_iter={s['sklearn_grid_iter']})",
        "grid": {k: [str(v) for v in vs] for k, vs in grid.items()},
        "candidates": candidates,
        "folds": s["sklearn_folds"],
        "rows": s["sklearn_grid_rows"],
        "n_jobs": workers if tuned else "library default (None: one)",
        "n_jobs_how": how if tuned else "library default",
        "inner_max_num_threads": "not set (a user's plain GridSearchCV)" if tuned else "library default",
        "share": share,
        "cores": cores,
        "parallel_s": par_s,
        "sequential_s": seq_s,
        "parallel_per_min": candidates / par_s * 60,
        "sequential_per_min": candidates / seq_s * 60,
        "workers_seen": [
            {
                "pid": w["pid"],
                "main": w["pid"] == os.getpid(),
                "blas": [q["num_threads"] for q in w["pools"] if q["user_api"] == "blas"],
                "openmp": [q["num_threads"] for q in w["pools"] if q["user_api"] == "openmp"],
            }
            for w in seen
        ],
    }
    return out


WORKERS = {"sklearn": w_sklearn}


# ---------------------------------------------------------------- control node

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
