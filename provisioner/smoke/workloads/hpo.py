"""Parallel hyperparameter-search trials against the same trials one after another, and the oversubscribed run.

Measured on the target (WORKERS, in the ML environment); judged on the control node, which
reads results.hpo: runs {sequential, parallel, oversubscribed:
{trials_per_min, procs, threads_each, trials, trials_expected, processes_seen}}, trials,
library, rows, trees, sampler, best_loss; the raw result's mode.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import shutil
import subprocess
import time
from typing import Any

from ..base import FAIL, INFO, PASS, SKIP, WARN, Check, Objective, _problem, grade
from ..target.ml import _data, _env_int, _missing

NAME = "hpo"
# The plan values whose change moves its figures: what the tuner may search (registry: KNOBS).
KNOBS: tuple[str, ...] = ("trials", "threads_per_trial")
# What `provisioner tune` optimises: the study's trials per minute with N processes as ml-env starts
# them (no sequential or oversubscribed reference runs).
TUNE = Objective("trials/min", True, lambda r: float(r["tuned"]["trials_per_min"]))


# ---------------------------------------------------------------- target, ML environment

SIZES: dict[str, dict[str, Any]] = {
    "quick": {"hpo_rows": 100_000, "hpo_trees": 40, "hpo_trials_per_worker": 2},
    "full": {"hpo_rows": 1_000_000, "hpo_trees": 100, "hpo_trials_per_worker": 4},
}


_TRIAL_DATA: dict[int, Any] = {}


def _trial_data(rows: int):
    if rows not in _TRIAL_DATA:
        _TRIAL_DATA[rows] = _data(rows, 28, seed=7)
    return _TRIAL_DATA[rows]


def _warm(args: tuple[int, str]) -> None:
    """Start a pool process: import the libraries and make the data, as a long-lived trial worker has."""
    rows, lib = args
    __import__(lib)
    __import__("optuna")
    _trial_data(rows)
    time.sleep(0.5)  # hold this worker so every process of the pool gets a warm-up of its own


def _trial(args: tuple[dict[str, Any], int | None, int, int, str]) -> float:
    """One hyperparameter trial: train on synthetic data with `threads` (None: library default), return its loss."""
    params, threads, rows, trees, lib = args
    import numpy as np

    x, y = _trial_data(rows)
    pred: Any  # the probabilities, as an array of whichever library
    if lib == "lightgbm":
        import lightgbm as lgb

        extra = {"num_threads": threads} if threads else {}
        booster = lgb.train(
            {"objective": "binary", "verbose": -1, **params, **extra}, lgb.Dataset(x, label=y), num_boost_round=trees
        )
        pred = booster.predict(x[:10000])
    elif lib == "sklearn":
        from sklearn.ensemble import HistGradientBoostingClassifier

        model = HistGradientBoostingClassifier(
            max_iter=trees,
            max_leaf_nodes=params["num_leaves"],
            max_depth=params["max_depth"],
            learning_rate=params["learning_rate"],
            early_stopping=False,
        )
        pred = model.fit(x, y).predict_proba(x[:10000])[:, 1]
    else:
        import xgboost as xgb

        extra = {"nthread": threads} if threads else {}
        mapped = {"max_depth": params["max_depth"], "learning_rate": params["learning_rate"]}
        xgb_booster = xgb.train(
            {"tree_method": "hist", "objective": "binary:logistic", **mapped, **extra},
            xgb.DMatrix(x, label=y),
            num_boost_round=trees,
        )
        pred = xgb_booster.predict(xgb.DMatrix(x[:10000]))
    eps = 1e-7
    return float(-np.mean(y[:10000] * np.log(pred + eps) + (1 - y[:10000]) * np.log(1 - pred + eps)))


def _journal(path: str):
    """Optuna's journal storage on one file (no database): JournalFileBackend, JournalFileStorage before Optuna 4."""
    import optuna

    try:
        from optuna.storages.journal import JournalFileBackend
    except ImportError:  # Optuna 3
        return optuna.storages.JournalStorage(optuna.storages.JournalFileStorage(path)), "JournalFileStorage"
    return optuna.storages.JournalStorage(JournalFileBackend(path)), "JournalFileBackend"


def _study_process(args: tuple[str, int, int | None, int, int, str, int]) -> int:
    """One process of the study: load it from the shared journal file and run `n` trials in it."""
    path, n, threads, rows, trees, lib, seed = args
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="smoke", storage=_journal(path)[0], sampler=optuna.samplers.TPESampler(seed=seed))

    def objective(trial) -> float:
        trial.set_user_attr("pid", os.getpid())
        params = {
            "num_leaves": trial.suggest_int("num_leaves", 15, 255),
            "max_depth": trial.suggest_int("max_depth", 4, 10),
            "learning_rate": trial.suggest_float("learning_rate", 0.02, 0.3, log=True),
        }
        return _trial((params, threads, rows, trees, lib))

    # The enqueued parameter sets come first, each taken by exactly one process through the journal.

    study.optimize(objective, n_trials=n)
    return n


def _hpo_queue(count: int) -> list[dict[str, Any]]:
    """The study's parameter sets, the same in every run (enqueued in order)."""
    rng = random.Random(0)
    return [
        {
            "num_leaves": rng.randint(15, 255),
            "max_depth": rng.randint(4, 10),
            "learning_rate": round(math.exp(rng.uniform(math.log(0.02), math.log(0.3))), 4),
        }
        for _ in range(count)
    ]


def ml_env_trial(trials: int, run=subprocess.run) -> tuple[dict[str, str] | None, str]:
    """The thread variables `ml-env --trials N` gives a trial, from ml-env itself (--print), or
    None and why: how a user runs N processes of a study (`ml-env --trials N -- python tune.py`)."""
    exe = shutil.which("ml-env")
    if exe is None:
        return None, "ml-env is not on PATH (role thread_env installs it)"
    r = run([exe, "--trials", str(trials), "--print"], capture_output=True, text=True, timeout=60)
    rows = [line.split() for line in r.stdout.splitlines() if line.strip() and not line.startswith("#")]
    if r.returncode != 0 or not rows:
        return None, f"ml-env --trials {trials} --print failed: {(r.stderr or r.stdout).strip()[:200]}"
    env = dict(word.split("=", 1) for word in rows[0] if "=" in word)
    env.pop("ML_ENV_TRIAL", None)
    return env, f"ml-env --trials {trials}"


@contextlib.contextmanager
def _environ(extra: dict[str, str] | None):
    """os.environ with `extra` set (processes started inside inherit it), restored afterwards."""
    saved = {k: os.environ.get(k) for k in extra or {}}
    os.environ.update(extra or {})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def alone_threads(tuned: bool) -> int | str:
    """One process's threads: the login shell's (the plan's count when tuned; library defaults in a baseline)."""
    return _env_int("OMP_NUM_THREADS") if tuned else "library default"


def w_hpo(p: dict[str, Any]) -> dict[str, Any]:
    """A real Optuna study: N processes share one journal file, each with the environment `ml-env
    --trials N` gives a trial (its share of the cores), against the same study run by one process
    and against every process on the login shell's threads (every core each). No trial passes a
    thread count: the libraries take what the environment says, as in a user's objective."""
    import importlib.util
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    missing = _missing("optuna", "hpo")
    if missing:
        return missing
    import optuna

    s = SIZES[p["profile"]]
    lib = "lightgbm" if importlib.util.find_spec("lightgbm") else "xgboost" if importlib.util.find_spec("xgboost") else None
    if lib is None:
        return {"skipped": "neither lightgbm nor xgboost is installed (component gbdt)"}
    workers = max(1, p["trials"])
    cores = p["threads"]
    each = s["hpo_trials_per_worker"]
    tuned = p["mode"] == "tuned"
    ctx = mp.get_context("spawn")
    backend = _journal(os.path.join(p["workdir"], "probe.journal"))[1]

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Every run evaluates the same parameter sets in the same order (enqueued in its study), so
    # the runs differ only in how the trials share the cores.
    queue = _hpo_queue(workers * each)

    def study_run(label: str, procs: int, env: dict[str, str] | None, threads: int | str, per_proc: int) -> dict[str, Any]:
        path = os.path.join(p["workdir"], f"hpo-{label}.journal")
        study = optuna.create_study(study_name="smoke", storage=_journal(path)[0], direction="minimize")
        for params in queue[: procs * per_proc]:
            study.enqueue_trial(params)
        jobs = [(path, per_proc, None, s["hpo_rows"], s["hpo_trees"], lib, i) for i in range(procs)]
        if procs == 1:
            _warm((s["hpo_rows"], lib))
            t0 = time.perf_counter()
            _study_process(jobs[0])
            secs = time.perf_counter() - t0
        else:
            # Started and warmed before the clock runs: a study's workers live for many trials.
            # Each process starts with `env` (ml-env's trial environment), as ml-env would start it.
            with ProcessPoolExecutor(max_workers=procs, mp_context=ctx) as pool:
                with _environ(env):
                    list(pool.map(_warm, [(s["hpo_rows"], lib)] * procs))
                t0 = time.perf_counter()
                list(pool.map(_study_process, jobs))
                secs = time.perf_counter() - t0
        study = optuna.load_study(study_name="smoke", storage=_journal(path)[0])
        done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        return {
            "procs": procs,
            "threads_each": threads,
            "seconds": secs,
            "trials": len(done),
            "trials_expected": procs * per_proc,
            "processes_seen": len({t.user_attrs.get("pid") for t in done}),
            "best_loss": min((t.value for t in done if t.value is not None), default=None),
            "journal_bytes": os.path.getsize(path),
            "trials_per_min": len(done) / secs * 60,
        }

    if p.get("tune"):
        # provisioner tune: N trials (the candidate's PROVISIONER_TUNE_TRIALS, else the plan's) as
        # `ml-env --trials N` starts them, over the same enqueued trials whatever N is, so that
        # candidates differ only in how the trials share the cores.
        n = int(os.environ.get("PROVISIONER_TUNE_TRIALS") or workers)
        per = -(-max(cores, n) * each // n)
        queue = _hpo_queue(n * per)
        with contextlib.suppress(FileNotFoundError):  # the journal of this run's last measurement
            os.remove(os.path.join(p["workdir"], "hpo-tuned.journal"))
        if n == 1:  # `ml-env --trials 1`: one process with every core, the login shell's threads
            return {"trials": n, "processes_how": "one process", "tuned": study_run("tuned", 1, None, alone_threads(tuned), per)}
        trial_env, how = ml_env_trial(n)
        if trial_env is None:
            return {"error": how}
        return {
            "trials": n,
            "processes_how": how,
            "tuned": study_run("tuned", n, trial_env, trial_env.get("OMP_NUM_THREADS", "?"), per),
        }

    runs: dict[str, Any] = {}
    # One process: the login shell's threads (the plan's count when tuned, library defaults in a baseline).
    alone = alone_threads(tuned)
    how = "library default"
    if workers > 1:
        # planned: N processes as `ml-env --trials N` starts them (baseline: the library defaults)
        trial_env, how = ml_env_trial(workers) if tuned else (None, "library default")
        shown = int(trial_env["OMP_NUM_THREADS"]) if trial_env and trial_env.get("OMP_NUM_THREADS", "").isdigit() else alone
        runs["parallel"] = study_run("parallel", workers, trial_env, shown, each)
        runs["sequential"] = study_run("sequential", 1, None, alone, workers * each)
        # The login shell's threads in every process: each trial takes every core. One trial per
        # process is enough to show it: oversubscribed runs can be very slow.
        runs["oversubscribed"] = study_run("oversubscribed", workers, None, alone, 1)
    else:
        runs["sequential"] = study_run("sequential", 1, None, alone, each)
    return {
        "library": lib,
        "sampler": f"optuna {optuna.__version__}, the same enqueued parameter sets in every run, one journal file per study ({backend})",
        "storage": backend,
        "trials": workers * each,
        "workers": workers,
        "cores": cores,
        "processes_how": how,
        "rows": s["hpo_rows"],
        "trees": s["hpo_trees"],
        "runs": runs,
        "best_loss": min((r["best_loss"] for r in runs.values() if r["best_loss"] is not None), default=None),
    }


WORKERS = {"hpo": w_hpo}


# ---------------------------------------------------------------- control node

HPO_GRADES = (0.9, 0.7)  # N processes of cores/N threads should at least match one-after-another


def hpo_checks(raw: dict[str, Any], hpo: dict[str, Any]) -> list[Check]:
    problem = _problem("hpo.parallel", "hyperparameter search", "parallel trials", hpo)
    if problem:
        return [problem]
    runs = hpo["runs"]
    detail = (
        f"{hpo['trials']} {hpo['library']} trials ({hpo['rows']:,} rows, {hpo['trees']} trees) per run, one run each, "
        f"{hpo['sampler']}" + (f"; best loss {hpo['best_loss']:.4f}" if isinstance(hpo.get("best_loss"), float) else "")
    )
    seq = runs["sequential"]["trials_per_min"]
    if "parallel" not in runs:
        return [
            Check(
                "hpo.parallel",
                "hyperparameter search",
                "parallel trials",
                SKIP,
                "one trial at a time (the plan's trials is 1, plan_trials): nothing to run in parallel"
                if hpo.get("workers") == 1 and int(hpo.get("cores") or 1) > 1
                else "one trial at a time on this host (one core): nothing to run in parallel",
                seq,
                "trials/min",
                detail=detail,
            )
        ]
    par, over = runs["parallel"], runs["oversubscribed"]
    ratio = par["trials_per_min"] / seq
    each = par["threads_each"]
    status = grade(ratio, HPO_GRADES)
    reason = f"{par['procs']} processes x {each} thread(s): {ratio:.2f}x the one-after-another rate"
    if status != PASS:
        reason += "; parallel trials lose to running them one by one: each trial's threads must be cores / trials"
    lost = [
        f"{name}: {r['trials']} of {r['trials_expected']} trials completed"
        for name, r in runs.items()
        if "trials_expected" in r and r["trials"] != r["trials_expected"]
    ]
    if "processes_seen" in par and par["processes_seen"] != par["procs"]:
        lost.append(f"the study's trials came from {par['processes_seen']} process(es), not {par['procs']}")
    if lost:
        status = FAIL
        reason = "the shared study lost work (" + "; ".join(lost) + "); " + reason
    out = [
        Check(
            "hpo.parallel",
            "hyperparameter search",
            "parallel trials",
            status,
            reason,
            par["trials_per_min"],
            "trials/min",
            seq,
            f"the same trials one after another, {runs['sequential']['threads_each']} thread(s) each",
            ratio,
            detail=detail,
        )
    ]
    oratio = over["trials_per_min"] / par["trials_per_min"]
    saved = 1 - oratio
    if raw.get("mode") != "tuned":
        ostatus, oreason = (
            INFO,
            (
                f"oversubscribed ({over['procs']} processes x {over['threads_each']} threads) runs at "
                f"{oratio:.0%} of the parallel rate with library defaults"
            ),
        )
    elif oratio <= 1.05:
        ostatus, oreason = (
            PASS,
            f"oversubscribed ({over['procs']} processes x {over['threads_each']} threads, {over.get('trials', hpo['trials'])} trials) runs at {oratio:.0%} of the planned rate: the thread plan saves {max(saved, 0):.0%}",
        )
    else:
        ostatus, oreason = WARN, f"oversubscribed ran {oratio - 1:.0%} faster than the plan's threads per trial here"
    out.append(
        Check(
            "hpo.oversubscribed",
            "hyperparameter search",
            "oversubscribed trials (every trial all threads)",
            ostatus,
            oreason,
            over["trials_per_min"],
            "trials/min",
            par["trials_per_min"],
            "the planned parallel rate",
            oratio,
            detail=detail,
        )
    )
    return out


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return hpo_checks(raw, result)
