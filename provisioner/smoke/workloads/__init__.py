"""The smoke workloads the control node judges, one module each, in the order their checks appear.

Each module is named as the target names the workload in its results (results.<NAME>) and has
NAME, `checks(raw, result)` (the raw result and that workload's entry of it -> its checks) and,
where the workload repeats a measurement, `spreads(result)` (check id -> the lowest and highest
figure over the repeats). provisioner.smoke.judgement iterates WORKLOADS; adding a workload here
adds its checks to every report.

Each module also holds its target half, run on the host from the smoke zipapp: SIZES (its sizes
in the quick and full profiles, keys prefixed as the raw result's "sizes" names them), WORKERS
(task -> the measuring function a worker runs in the ML environment), optionally drive(runner)
(its root-parent step: the parent otherwise runs its one worker) and ONLY_WHEN_NAMED (run only
when --only names it: smoke_workloads: [hgb], or smoke_cluster for cluster).

KNOBS names the plan values (provisioner.plan: the role variables each one becomes) whose change
moves the workload's figures: the search space a tuner measures it over, every name a value of the
plan (tests/unit/test_smoke_registry.py). The registry derives
from them what the target's parent runs: PROFILES, TASKS (the default run), CLUSTER_TASKS (every
workload run only when named, the Ray cluster's run among them) and WORKERS.

The workload modules import provisioner.smoke.base, provisioner.smoke.hardware and the target's
standard-library helpers (target.ml, target.probe, target.http) only; this registry imports them, and the
judgement and the target's parent import the registry, so no import circle forms.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import (
    cluster,
    dataloader,
    features,
    gbdt,
    gemm,
    hgb,
    hpo,
    inference,
    matrix,
    mlp,
    parquet,
    serving,
    sklearn,
    tensorflow,
    triad,
)

WORKLOADS: tuple[ModuleType, ...] = (
    gemm,
    triad,
    gbdt,
    mlp,
    hpo,
    parquet,
    inference,
    serving,
    sklearn,
    features,
    matrix,
    dataloader,
    tensorflow,
    hgb,
    cluster,
)

BY_NAME: dict[str, ModuleType] = {w.NAME: w for w in WORKLOADS}

# ---------------------------------------------------------------- what the target runs

TIMEOUT = {"quick": 900, "full": 7200}  # seconds, one worker
# Workload sizes. quick: about 90 s on a 2-core machine; full: the scale of real jobs
# (XGBoost hist on 10M rows, 100 trees, depth 10: the GBM-perf Airline setup): every module's
# SIZES in WORKLOADS' order, then the timeout of one worker.
PROFILES: dict[str, dict[str, Any]] = {
    profile: {**{k: v for w in WORKLOADS for k, v in w.SIZES[profile].items()}, "timeout": timeout}
    for profile, timeout in TIMEOUT.items()
}
TASKS: tuple[str, ...] = tuple(w.NAME for w in WORKLOADS if not getattr(w, "ONLY_WHEN_NAMED", False))
CLUSTER_TASKS: tuple[str, ...] = tuple(w.NAME for w in WORKLOADS if getattr(w, "ONLY_WHEN_NAMED", False))
# What the workloads measure in tuned mode: the code a user writes, in the ML user's login shell,
# with no thread limit a user would not set. The environment (role thread_env, and the ML
# environment's start-up hook for joblib's workers) decides every pool's threads; a workload
# reads what each library took and the checks hold that to the plan. Only the one-core
# reference runs (the per-core rates the limits scale) set a limit of 1, and say so.
WORKERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {task: fn for w in WORKLOADS for task, fn in w.WORKERS.items()}
