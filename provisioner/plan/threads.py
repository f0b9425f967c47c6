"""Threads: per job, parallel trials, the other runtimes' pools, the DataLoader
(docs/tuning.md, 'Threads')."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from provisioner.plan.base import PlanError, Setting, _get, _need
from provisioner.plan.options import PlanOptions

# Arrow's own IO pool size (arrow/util/io_util: 8 threads unless ARROW_IO_THREADS says otherwise).
ARROW_IO_THREADS = 8


def plan_threads(facts: Mapping[str, Any], options: PlanOptions, warnings: list[str]) -> list[Setting]:
    """Threads per job, parallel trials, threads per trial.  See docs/tuning.md, 'Threads'."""
    cores = _need(facts, "cpu.cores")
    threads = _need(facts, "cpu.threads")
    if not isinstance(cores, int) or cores < 1:
        raise PlanError(f"hardware facts report {cores!r} physical cores; need 1 or more")
    if not isinstance(threads, int) or threads < 1:
        raise PlanError(f"hardware facts report {threads!r} logical CPUs; need 1 or more")
    smt = _get(facts, "cpu.threads_per_core", max(1, threads // cores))
    if smt > 1:
        job_reason = (
            f"{cores}: {cores} physical cores, SMT ignored ({threads} threads; SMT adds little to "
            "BLAS/GBDT, oversubscription collapses throughput; PyTorch CPU tuning guide)"
        )
    else:
        job_reason = (
            f"{cores}: {cores} physical cores, no SMT; one thread per core "
            "(oversubscription collapses throughput; PyTorch CPU tuning guide)"
        )
    affinity = _get(facts, "cpu.affinity_cpus")
    if isinstance(affinity, int) and 0 < affinity < threads:
        warnings.append(
            f"the facts were gathered in a process allowed only {affinity} of {threads} CPUs "
            "(cpuset/affinity); jobs under the same limit should use fewer threads"
        )

    if options.trials is None:
        trials = cores
        trials_reason = f"{trials}: one trial per physical core (default; set plan_trials to change)"
    else:
        trials = options.trials
        trials_reason = _chosen("plan_trials", trials, cores, options, warnings, "parallel trials")
    per_trial = max(1, cores // trials)
    per_trial_reason = (
        f"{per_trial}: {cores} cores // {trials} trials; each trial is a process whose threads "
        "(XGBoost nthread, LightGBM num_threads, torch.set_num_threads, OMP_NUM_THREADS) are set "
        "explicitly (optuna issue 2270; dmlc/xgboost issue 7653)"
    )
    idle = cores - per_trial * trials
    if 0 < idle < cores and trials <= cores:
        per_trial_reason += f"; {idle} core(s) left for the driver process"
    return [
        Setting("threads_per_job", cores, job_reason),
        Setting("trials", trials, trials_reason),
        Setting("threads_per_trial", per_trial, per_trial_reason),
    ]


def _per_job(
    name: str,
    cores: int,
    options: PlanOptions,
    warnings: list[str],
    what: str,
    rule: str,
    carried: Callable[[int], str],
    rule_value: int | None = None,
) -> tuple[int, str]:
    """One job's pool: the physical cores (or RULE_VALUE) with the reason RULE, else plan_NAME's count
    (_chosen) with what carries it (CARRIED, given the count)."""
    value = getattr(options, name)
    if value is None:
        return (cores if rule_value is None else rule_value), rule
    return value, _chosen(f"plan_{name}", value, cores, options, warnings, what) + carried(value)


def _chosen(option: str, value: int, cores: int, options: PlanOptions, warnings: list[str], what: str) -> str:
    """The start of the reason for a count an option set ("4: plan_trials"). Above the physical
    cores it is refused, naming the value and the fix, unless plan_allow_oversubscription keeps
    it with a warning. See docs/tuning.md, 'Threads'."""
    if value <= cores:
        return f"{value}: {option}"
    if not options.allow_oversubscription:
        raise PlanError(
            f"{option}={value} is more than the {cores} physical cores; oversubscription "
            f"collapses throughput: lower {option} or set plan_allow_oversubscription: true"
        )
    warnings.append(f"{value} {what} on {cores} physical cores: oversubscribed by choice (plan_allow_oversubscription)")
    return f"{value}: {option}, above {cores} physical cores (plan_allow_oversubscription: true)"


def arrow_io_setting(options: PlanOptions) -> Setting:
    """Arrow's IO pool: its own default, 8, unless plan_arrow_io_threads sets it (what `provisioner
    tune --write` measured on the Parquet scan). IO threads wait on the drive, not on a core, so
    neither is bounded by the cores."""
    why = "IO threads wait on the drive, not on a core, so they are not sized by the cores (Arrow docs, thread pools)"
    if options.arrow_io_threads is None:
        return Setting("arrow_io_threads", ARROW_IO_THREADS, f"{ARROW_IO_THREADS}: ARROW_IO_THREADS, Arrow's own default; {why}")
    value = options.arrow_io_threads
    return Setting(
        "arrow_io_threads",
        value,
        f"{value}: plan_arrow_io_threads; ARROW_IO_THREADS, Arrow's IO pool of one job instead of its own default "
        f"({ARROW_IO_THREADS}); {why}",
    )


def plan_runtime_threads(facts: Mapping[str, Any], options: PlanOptions, warnings: list[str]) -> list[Setting]:
    """The thread pools of the other runtimes for one job: Polars, Arrow, TensorFlow, PyTorch's
    inter-op pool, joblib/loky.  See docs/tuning.md, 'Threads' ('Other runtimes').

    Each of them sizes its pool from the logical CPUs when nothing says otherwise (SMT counted),
    and each process of N parallel ones does so again: the counts here are for one job, and
    ml-env --trials N gives each trial the same share of every one as of the cores. Polars' pool
    and joblib's workers are threads_per_job unless plan_polars_threads or plan_joblib_workers
    set them (what `provisioner tune --write` measured); above the physical cores only with
    plan_allow_oversubscription."""
    cores = _need(facts, "cpu.cores")
    sockets = _get(facts, "cpu.sockets", 1)
    if not isinstance(sockets, int) or sockets < 1:
        sockets = 1
    inter = min(sockets, cores)
    per_socket = "one per socket" if sockets > 1 else "one socket"
    polars, polars_reason = _per_job(
        "polars_threads", cores, options, warnings, "Polars threads",
        f"{cores}: POLARS_MAX_THREADS = threads_per_job; Polars sizes its pool once, at first use, "
        "from the logical CPUs otherwise (Polars docs)",
        lambda _: f"; POLARS_MAX_THREADS, Polars' pool of one job instead of threads_per_job ({cores}); Polars sizes "
        "its pool once, at first use (Polars docs)",
    )  # fmt: skip
    joblib, joblib_reason = _per_job(
        "joblib_workers", cores, options, warnings, "joblib workers",
        f"{cores}: LOKY_MAX_CPU_COUNT caps joblib.cpu_count(), so n_jobs=-1 starts one worker per "
        "physical core, not per logical CPU (loky cpu_count; scikit-learn parallelism docs)",
        lambda n: f"; LOKY_MAX_CPU_COUNT caps joblib.cpu_count(), so n_jobs=-1 starts {n} worker(s) instead of "
        f"one per physical core ({cores}) (loky cpu_count; scikit-learn parallelism docs)",
    )  # fmt: skip
    why_inter = "independent ops run side by side, each on the intra-op pool; TensorFlow's default is every CPU again"
    tf_inter, tf_inter_reason = _per_job(
        "tf_inter_op_threads", cores, options, warnings, "TensorFlow inter-op threads",
        f"{inter}: TF_NUM_INTEROP_THREADS, {per_socket}: {why_inter} (Intel TensorFlow tuning guide)",
        lambda _: f"; TF_NUM_INTEROP_THREADS, TensorFlow's inter-op pool of one job instead of the rule's {inter} "
        f"({per_socket}); {why_inter}",
        rule_value=inter,
    )  # fmt: skip
    return [
        Setting("polars_threads", polars, polars_reason),
        Setting(
            "arrow_cpu_threads",
            cores,
            f"{cores}: Arrow's CPU pool reads OMP_NUM_THREADS (threads_per_job), else the logical CPUs; "
            "pyarrow.set_cpu_count() per process (Arrow docs, thread pools)",
        ),
        arrow_io_setting(options),
        Setting(
            "tf_intra_op_threads",
            cores,
            f"{cores}: TF_NUM_INTRAOP_THREADS = threads_per_job; TensorFlow's default is every schedulable "
            "CPU, SMT counted (tensorflow process_util.cc; Intel TensorFlow tuning guide)",
        ),
        Setting("tf_inter_op_threads", tf_inter, tf_inter_reason),
        Setting(
            "torch_interop_threads",
            inter,
            f"{inter}: {per_socket}, as for TensorFlow; torch reads no variable for it, so it reaches a "
            "process as PROVISIONER_TORCH_INTEROP_THREADS for torch.set_num_interop_threads(), called "
            "before any parallel work (PyTorch CPU threading docs)",
        ),
        Setting("joblib_workers", joblib, joblib_reason),
    ]


def dataloader_split(cores: int, workers: int | None = None) -> tuple[int, int]:
    """(DataLoader workers, torch threads of the training process) for a job on CORES cores.
    See docs/tuning.md, 'Threads' ('DataLoader').

    Every worker is a process that runs one torch thread (the DataLoader sets it), so workers +
    training threads <= cores: one worker per 4 cores (none on one core: loading happens in the
    training process), the rest for the training threads."""
    if workers is None:
        workers = 0 if cores < 2 else max(1, cores // 4)
    return workers, max(1, cores - workers)


def plan_dataloader(facts: Mapping[str, Any], options: PlanOptions, warnings: list[str]) -> list[Setting]:
    """DataLoader workers and the training threads next to them.  See docs/tuning.md, 'Threads'
    ('DataLoader')."""
    cores = _need(facts, "cpu.cores")
    workers = options.dataloader_workers
    if workers is not None and workers + 1 > cores:
        if not options.allow_oversubscription:
            raise PlanError(
                f"plan_dataloader_workers={workers} leaves no core for the training threads: workers + at least "
                f"1 thread must not exceed the {cores} physical cores (at most {cores - 1} worker(s)); lower "
                "plan_dataloader_workers or set plan_allow_oversubscription: true"
            )
        warnings.append(
            f"{workers} DataLoader workers + 1 training thread on {cores} physical cores: oversubscribed by choice "
            "(plan_allow_oversubscription)"
        )
    workers, threads = dataloader_split(cores, workers)
    if options.dataloader_workers is not None:
        how = "plan_dataloader_workers"
    elif workers:
        how = f"{cores} physical cores // 4, at least 1"
    else:
        how = "one core: batches load in the training process (num_workers=0)"
    return [
        Setting(
            "dataloader_workers",
            workers,
            f"{workers}: DataLoader num_workers ({how}); each worker is a process with one torch thread "
            "(torch.utils.data sets it), workers + training threads <= cores (PyTorch DataLoader docs)",
        ),
        Setting(
            "dataloader_threads",
            threads,
            f"{threads}: torch.set_num_threads of the training process next to {workers} worker(s): "
            f"{min(cores, workers + threads)} of {cores} cores"
            + (" (oversubscribed by choice)" if workers + threads > cores else ""),
        ),
    ]
