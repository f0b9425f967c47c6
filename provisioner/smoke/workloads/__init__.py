"""The smoke workloads the control node judges, one module each, in the order their checks appear.

Each module is named as the target names the workload in its results (results.<NAME>) and has
NAME, `checks(raw, result)` (the raw result and that workload's entry of it -> its checks) and,
where the workload repeats a measurement, `spreads(result)` (check id -> the lowest and highest
figure over the repeats). provisioner.smoke.judgement iterates WORKLOADS; adding a workload here
adds its checks to every report.

The workload modules import provisioner.smoke.base and provisioner.smoke.hardware only; this
registry imports them, and the judgement imports the registry, so no import circle forms.
"""

from __future__ import annotations

from types import ModuleType

from . import (
    cluster,
    dataloader,
    features,
    gbdt,
    gemm,
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
    cluster,
)

BY_NAME: dict[str, ModuleType] = {w.NAME: w for w in WORKLOADS}
