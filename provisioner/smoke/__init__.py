"""The smoke test's judgement: raw figures from a host -> checks against the hardware's limits.

Pure functions (evaluate, peak derivation, regression and baseline comparison) plus the
small history store under the state directory; `provisioner.commands.smoke` runs the
playbook and `provisioner.report` renders the HTML. The figures come from
provisioner/smoke/target (run on the target from the zipapp provisioner.smoke.zipapp builds); limits and their derivation follow
docs/tuning.md, 'Smoke test limits' (which also gives each grade's reason and source):

- compute peak = cores x FP64 FLOPs/cycle x clock (FP32: twice), the clock measured under
  DGEMM load where a cpufreq driver reports it, else counted in cycles by a dependent-add loop
  on one core (the one-core peak) and on all cores at once (the all-core peak), else the
  nominal clock (and the report says which, and why);
- DRAM = channels x 8 B x MT/s from the DIMMs' configured speed (one DIMM per channel assumed),
  else no ratio;
- a GBDT's all-core rate against its one-core rate times the cores (linear scaling);
- a PyTorch MLP step against torch's own SGEMM rate, measured in the same process;
- N parallel trials against the same trials run one after another;
- a Parquet scan against the same file read raw from the same mount (and the decode rate);
- single-row predict latency against what an endpoint can afford;
- the model server under HTTP load (wrk at 1, 8 and 32 connections): requests/s at 8 against
  the in-process predict rate through the server's own loader times the physical cores (the
  ratio is what the HTTP layer costs), p99 against what an endpoint can afford, and no failed
  request at any level;
- with the host's monthly price, the measured throughput as $ per million predictions and $ per
  trial, next to cloud instances of the same class (docs/tuning.md, 'Cost').

The package, all of it on the control node, from the bottom up: `base` (Check, HostReport, the
statuses, grade), `hardware` (the limits above), `workloads/<name>.py` (one module per workload
as the target names it in its results: its grades, its checks and its repeat spreads),
`workloads/__init__.py` (the registry, WORKLOADS, in report order), `config` (the idle-host and
configuration checks), `cost`, `judgement` (evaluate, repeat_spreads), `compare` (baseline and
regressions) and `store` (history per host, judge, SmokeRun). This module re-exports their names.
"""

from __future__ import annotations

from .base import _RANK, FAIL, INFO, PASS, SKIP, WARN, Check, HostReport, _problem, grade, number, span
from .compare import ILLUSTRATIONS, REGRESSION, _better_ratio, attach_baseline, flag_regressions
from .config import BUSY_SHARE, config_checks, load_check
from .cost import COST_SOURCES, HOURS_PER_MONTH, cost_checks, cost_per_million, cost_per_trial, hourly_price
from .hardware import _clock, clock_ghz, dram_gbps, fp64_flops_per_cycle
from .judgement import evaluate, repeat_spreads
from .store import SmokeRun, default_html, history_dir, judge, latest, save
from .workloads import WORKLOADS
from .workloads.cluster import cluster_checks
from .workloads.dataloader import LOADER_GRADES, LOADER_WAIT_PCT, dataloader_checks
from .workloads.features import FEATURES_GRADES, features_checks
from .workloads.gbdt import GBDT_GRADES, gbdt_checks
from .workloads.gemm import GEMM_GRADES, gemm_checks
from .workloads.hpo import HPO_GRADES, hpo_checks
from .workloads.inference import LATENCY_P99_US, inference_checks
from .workloads.matrix import MATRIX_GRADES, matrix_checks
from .workloads.mlp import MLP_GRADES, mlp_checks
from .workloads.parquet import PARQUET_GRADES, SNAPPY_DECODE_GBPS_PER_CORE, parquet_check
from .workloads.serving import (
    SERVING_CONNECTIONS,
    SERVING_GRADES,
    SERVING_P99_MS,
    _failed_requests,
    serving_checks,
    serving_curve,
    serving_level,
)
from .workloads.sklearn import SKLEARN_FOREST_GRADES, SKLEARN_GRID_GRADES, sklearn_checks
from .workloads.tensorflow import tensorflow_checks
from .workloads.triad import TRIAD_GRADES, triad_check

__all__ = [
    "BUSY_SHARE",
    "COST_SOURCES",
    "FAIL",
    "FEATURES_GRADES",
    "GBDT_GRADES",
    "GEMM_GRADES",
    "HOURS_PER_MONTH",
    "HPO_GRADES",
    "ILLUSTRATIONS",
    "INFO",
    "LATENCY_P99_US",
    "LOADER_GRADES",
    "LOADER_WAIT_PCT",
    "MATRIX_GRADES",
    "MLP_GRADES",
    "PARQUET_GRADES",
    "PASS",
    "REGRESSION",
    "SERVING_CONNECTIONS",
    "SERVING_GRADES",
    "SERVING_P99_MS",
    "SKIP",
    "SKLEARN_FOREST_GRADES",
    "SKLEARN_GRID_GRADES",
    "SNAPPY_DECODE_GBPS_PER_CORE",
    "TRIAD_GRADES",
    "WARN",
    "WORKLOADS",
    "_RANK",
    "Check",
    "HostReport",
    "SmokeRun",
    "_better_ratio",
    "_clock",
    "_failed_requests",
    "_problem",
    "annotations",
    "attach_baseline",
    "clock_ghz",
    "cluster_checks",
    "config_checks",
    "cost_checks",
    "cost_per_million",
    "cost_per_trial",
    "dataloader_checks",
    "default_html",
    "dram_gbps",
    "evaluate",
    "features_checks",
    "flag_regressions",
    "fp64_flops_per_cycle",
    "gbdt_checks",
    "gemm_checks",
    "grade",
    "history_dir",
    "hourly_price",
    "hpo_checks",
    "inference_checks",
    "judge",
    "latest",
    "load_check",
    "matrix_checks",
    "mlp_checks",
    "number",
    "parquet_check",
    "repeat_spreads",
    "save",
    "serving_checks",
    "serving_curve",
    "serving_level",
    "sklearn_checks",
    "span",
    "tensorflow_checks",
    "triad_check",
]
