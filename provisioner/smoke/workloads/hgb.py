"""scikit-learn's HistGradientBoostingClassifier: the all-core rate against its own one-core rate x the cores.

Run only when named (smoke_workloads: [hgb], the target's --only hgb). Measured on the target
(WORKERS, in the ML environment, as the ML user with the plan's thread settings: the fit sets no
thread limit, so OpenMP takes what the environment gives a user's plain code); judged on the
control node, which reads results.hgb: rows, cols, iterations, sklearn, all and one
{row_iterations_per_s, iterations, threads, times_s}; the raw result's threads.

No hardware figure bounds a histogram booster (memory-bound, latency-bound at few rows per
thread), so the limit is the workload's own one-thread run x the cores, as gbdt's.
"""

from __future__ import annotations

import time
from typing import Any

from ..base import Check, _problem, linear_scaling
from ..target.ml import _data, _env_default, _missing, median

NAME = "hgb"
# The plan values whose change moves its figures: what the tuner may search (registry: KNOBS).
KNOBS: tuple[str, ...] = ("threads_per_job", "omp_proc_bind", "kmp_blocktime")


# ---------------------------------------------------------------- target, ML environment

# Run only when named: the default quick smoke's time does not grow. Both runs fit the same
# iterations: a fit has no per-iteration hook, and its binning (threaded too) would flatter a
# shorter one-thread run.
ONLY_WHEN_NAMED = True
SIZES: dict[str, dict[str, Any]] = {
    "quick": {"hgb_rows": 200_000, "hgb_cols": 28, "hgb_iterations": 50, "hgb_repeats": 1},
    "full": {"hgb_rows": 2_000_000, "hgb_cols": 28, "hgb_iterations": 100, "hgb_repeats": 3},
}


def _fit(x, y, iterations: int) -> float:
    """Fit `iterations` boosting iterations (no early stopping, so every one runs); seconds."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    model = HistGradientBoostingClassifier(max_iter=iterations, early_stopping=False, random_state=0)
    t0 = time.perf_counter()
    model.fit(x, y)
    return time.perf_counter() - t0


def _openmp_threads() -> int | None:
    """The OpenMP threads this process runs now, as threadpoolctl reads them."""
    from threadpoolctl import threadpool_info

    return max((i["num_threads"] for i in threadpool_info() if i.get("user_api") == "openmp"), default=None)


def w_hgb(p: dict[str, Any]) -> dict[str, Any]:
    """The fit as a user's code runs it (no thread limit), then the one-thread reference run, which
    alone sets a limit of 1 (threadpoolctl) and says so."""
    missing = _missing("sklearn", "core")
    if missing:
        return missing
    import sklearn
    from threadpoolctl import threadpool_limits

    s = SIZES[p["profile"]]
    tuned = p["mode"] == "tuned"
    rows, cols = s["hgb_rows"], s["hgb_cols"]
    x, y = _data(rows, cols)
    _fit(x[:1000], y[:1000], 2)  # imports and OpenMP's pool started outside the timing
    out: dict[str, Any] = {"rows": rows, "cols": cols, "iterations": s["hgb_iterations"], "sklearn": sklearn.__version__}
    iterations = s["hgb_iterations"]
    for label, limit in (("all", None), ("one", 1)):
        if limit:
            with threadpool_limits(limits=limit, user_api="openmp"):
                times = [_fit(x, y, iterations) for _ in range(s["hgb_repeats"])]
            threads: Any = 1
        else:
            times = [_fit(x, y, iterations) for _ in range(s["hgb_repeats"])]
            threads = _openmp_threads() or _env_default(tuned, "OMP_NUM_THREADS")
        out[label] = {
            "iterations": iterations,
            "threads": threads,
            "times_s": times,
            "row_iterations_per_s": rows * iterations / median(times),
        }
    return out


WORKERS = {"hgb": w_hgb}


# ---------------------------------------------------------------- control node

HGB_GRADES = (0.3, 0.15)  # as gbdt's: histogram boosting scales 5-7x on 16 cores (memory-bound)


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    title = "scikit-learn HistGradientBoosting training"
    problem = _problem("hgb", "gradient boosting", title, result)
    if problem:
        return [problem]
    allc, one = result["all"], result["one"]
    cores = int(raw.get("threads") or 1)
    fig, limit, ratio, status, reason = linear_scaling(
        allc["row_iterations_per_s"], one["row_iterations_per_s"], cores, HGB_GRADES
    )
    detail = (
        f"{result.get('rows'):,} x {result.get('cols')}, {allc['iterations']} iterations on {allc['threads']} threads, "
        f"{one['iterations']} on 1; median of {len(allc.get('times_s', []))}; scikit-learn {result.get('sklearn')}"
    )
    basis = (
        f"the one-thread rate ({one['row_iterations_per_s'] / 1e6:.2f} M row-iterations/s) x {cores} cores "
        "(linear scaling; no hardware limit bounds it)"
    )
    return [
        Check("hgb", "gradient boosting", title, status, reason, fig, "M row-iterations/s", limit, basis, ratio, detail=detail)
    ]
