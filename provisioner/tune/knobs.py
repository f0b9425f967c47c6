"""The knobs tune searches: plan values it can apply to one measurement the way the roles apply them.

A knob is a value of the plan (provisioner.plan) that a user's code receives through the
environment role thread_env writes for the ML user's login shells, or a setting of the kernel's
that role cpu_tuning writes (THP's mode: set for each measurement, put back after the run,
provisioner.tune.live). To measure a candidate, tune
runs the workload exactly so: the same login shell, with the knob's variables set to the
candidate (or left unset: the library's own default). Written back, the value becomes the plan's
override (plan_<knob>) and `provisioner up` makes thread_env write the same variables.

Each knob's candidates come from the host's own plan and cores: every count from 1 (or 0 where a
count may be 0) to the physical cores, and the library's default where it differs from them. More
than the cores only with plan_allow_oversubscription: the plan refuses such a value otherwise.

Standard library only: the control node checks names here, the host's tune run (shipped in the
smoke zipapp) builds the candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Env = dict[str, "str | None"]  # variable -> value; None: unset (the library's default)


Live = tuple[tuple[str, str], ...]  # (kernel file, value): what a kernel knob writes for one measurement


@dataclass(frozen=True)
class Knob:
    name: str  # the plan value, and plan_<name> its override
    lowest: int  # the smallest count that is a candidate
    env: Callable[[Any, int], Env]  # (value, physical cores) -> the variables that carry it
    default: int | None = None  # the library's own count; None: the logical CPUs (a pool sized by the machine)
    # Threads that wait on a drive, not on a core (Arrow's IO pool): powers of two and the cores are the
    # candidates, to the library's own count's double whatever the cores, none of them oversubscribing.
    waits: bool = False
    # A setting of the kernel's: its values (every one a candidate), the file it is set in for each
    # measurement and put back from after the run (provisioner.tune.live), the plan's option for it.
    choices: tuple[str, ...] = ()
    sysfs: str = ""
    override: str = ""
    stock: str = ""  # of the choices, the library's own (its candidate is labelled so)
    # A count that shares the cores with another knob's (serving: workers x threads per worker):
    # whether a value is one the plan would take beside the values kept before it (value, kept
    # variables, plan, cores, oversubscription allowed), and the rule once those are kept (rule, kept
    # variables, plan, cores), where it follows them; the plan's values its measurements depend on
    # (in its study's key, so a study measured under others is not resumed).
    fits: Callable[[int, Env, Mapping[str, Any], int, bool], bool] | None = None
    rule_given: Callable[[Any, Env, Mapping[str, Any], int], Any] | None = None
    follows: tuple[str, ...] = ()

    @property
    def option(self) -> str:
        return self.override or f"plan_{self.name}"

    def live(self, value: Any) -> Live:
        return ((self.sysfs, str(value)),) if self.sysfs else ()


def _count_in(variable: str) -> Callable[[Any, int], Env]:
    """A pool's count carried by one variable of its own (None: unset, the library's default)."""

    def env(value: Any, _cores: int) -> Env:
        return {variable: None if value is None else str(int(value))}

    return env


_polars = _count_in("POLARS_MAX_THREADS")
# LOKY_MAX_CPU_COUNT caps joblib.cpu_count(): a user's n_jobs=-1 starts that many workers.
_joblib = _count_in("LOKY_MAX_CPU_COUNT")
_arrow_io = _count_in("ARROW_IO_THREADS")
_tf_inter = _count_in("TF_NUM_INTEROP_THREADS")


def _dataloader(value: Any, cores: int) -> Env:
    # The training threads take the cores the workers leave (the plan's dataloader_threads follows).
    workers = int(value)
    return {
        "PROVISIONER_DATALOADER_WORKERS": str(workers),
        "PROVISIONER_DATALOADER_THREADS": str(max(1, cores - workers)),
    }


def _trials(value: Any, _cores: int) -> Env:
    # The N of `ml-env --trials N`, which gives each of N trial processes cores // N threads; the
    # plan's count is what `ml-env --trials plan` reads. Only tune's measurement reads this variable.
    return {"PROVISIONER_TUNE_TRIALS": str(int(value))}


def _none(_value: Any, _cores: int) -> Env:
    return {}


# The throwaway model server tune measures (the serving workload's tune_drive): its workers and
# threads per worker. Only tune's measurement reads these variables.
SERVING_WORKERS = "PROVISIONER_TUNE_SERVING_WORKERS"
SERVING_THREADS = "PROVISIONER_TUNE_SERVING_THREADS"
SERVING_ALLOCATOR = "PROVISIONER_TUNE_SERVING_ALLOCATOR"


def serving_shape(env: Mapping[str, str | None], plan: Mapping[str, Any], cores: int) -> tuple[int, int]:
    """(workers, threads per worker) of a measurement with ENV: the candidate's, else the plan's. The
    plan's workers follow its threads (cores // threads) unless plan_serving_workers fixed them (the
    plan's "fixed": the values the inventory's options set), so a threads candidate runs with the
    workers the plan would give it, as `up` applies it written back."""
    threads = int(env.get(SERVING_THREADS) or plan["serving_threads_per_worker"])
    if env.get(SERVING_WORKERS):
        return int(str(env[SERVING_WORKERS])), threads
    if "serving_workers" in (plan.get("fixed") or ()):
        return int(plan["serving_workers"]), threads
    return max(1, cores // threads), threads


def planned(env: Mapping[str, str | None], plan: Mapping[str, Any], cores: int) -> dict[str, Any]:
    """The plan's values as a measurement with ENV runs under them: what a workload's root-parent
    step (the model server's, which starts processes of its own rather than one in the user's
    shell) reads instead of the environment; a plan with no model server's shape (another workload's
    step) as it is."""
    if plan.get("serving_threads_per_worker") is None and not env.get(SERVING_THREADS):
        return dict(plan)
    workers, threads = serving_shape(env, plan, cores)
    allocator = env.get(SERVING_ALLOCATOR) or plan.get("serving_allocator") or "glibc"
    return {**plan, "serving_workers": workers, "serving_threads_per_worker": threads, "serving_allocator": allocator}


def _serving_workers(value: Any, _cores: int) -> Env:
    return {SERVING_WORKERS: str(int(value))}


def _serving_threads(value: Any, _cores: int) -> Env:
    return {SERVING_THREADS: str(int(value))}


def _serving_allocator(value: Any, _cores: int) -> Env:
    return {SERVING_ALLOCATOR: str(value)}


# provisioner.plan.serving's: the least model cache a worker may be left with (tests/unit/test_tune.py
# holds them equal; this module imports nothing of provisioner's).
SERVING_MIN_CACHE_BYTES = 256 * 1024**2


def _shape_fits(workers: int, threads: int, plan: Mapping[str, Any], cores: int, allow_oversubscription: bool) -> bool:
    """Whether the plan takes WORKERS x THREADS: within the cores (unless oversubscription is
    allowed), and each worker's share of the serving memory budget leaving it a model cache."""
    if workers * threads > cores and not allow_oversubscription:
        return False
    budget, overhead = plan.get("serving_memory_budget_bytes"), plan.get("serving_worker_overhead_bytes")
    if budget is None or overhead is None:
        return True
    return int(budget) // workers - int(overhead) >= SERVING_MIN_CACHE_BYTES


def _workers_fit(value: int, kept: Env, plan: Mapping[str, Any], cores: int, allow_oversubscription: bool) -> bool:
    return _shape_fits(value, serving_shape(kept, plan, cores)[1], plan, cores, allow_oversubscription)


def _threads_fit(value: int, kept: Env, plan: Mapping[str, Any], cores: int, allow_oversubscription: bool) -> bool:
    workers, threads = serving_shape({**kept, SERVING_THREADS: str(value)}, plan, cores)
    return _shape_fits(workers, threads, plan, cores, allow_oversubscription)


def _workers_rule(_rule: Any, kept: Env, plan: Mapping[str, Any], cores: int) -> int:
    return serving_shape(kept, plan, cores)[0]


# What a serving measurement depends on besides its candidate: the plan's shape and allocator, the
# values the inventory fixes, the memory budget, and the model server's own code (serving_code: its files' hash).
SERVING_FOLLOWS = (
    "serving_workers",
    "serving_threads_per_worker",
    "serving_allocator",
    "fixed",
    "serving_memory_budget_bytes",
    "serving_worker_overhead_bytes",
    "serving_code",
)

THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
THP_DEFRAG = "/sys/kernel/mm/transparent_hugepage/defrag"

# Polars' pool, and joblib/loky's workers of n_jobs=-1 (both default to the logical CPUs); Arrow's IO
# pool (its default 8, whatever the cores: its threads wait on the drive, measured on the Parquet scan);
# TensorFlow's inter-op pool (its default the logical CPUs, measured on the Keras training step); the
# DataLoader's worker processes (the library's default 0: batches load in the training process);
# parallel trials of a study (Optuna's default n_jobs=1: one trial at a time, with every core);
# the model server's threads per worker (OpenMP's default: one per logical CPU) and then its workers
# (uvicorn's default: one), each worker on its own cores as the plan slices them, and the allocator
# its workers run with (glibc's malloc, the default, or jemalloc preloaded as role allocator does);
# transparent huge pages' mode and defrag policy, the kernel's (every value a candidate, the stock
# one among them: a distribution's kernel boots with always or madvise), set live for each
# measurement and put back. The choices are the kernel's own words, in its order.
KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob("polars_threads", 1, _polars),
        Knob("joblib_workers", 1, _joblib),
        Knob("arrow_io_threads", 1, _arrow_io, default=8, waits=True, follows=("data_location",)),
        Knob("tf_inter_op_threads", 1, _tf_inter),
        Knob("dataloader_workers", 0, _dataloader, default=0),
        Knob("trials", 1, _trials, default=1),
        Knob("serving_threads_per_worker", 1, _serving_threads, fits=_threads_fit, follows=SERVING_FOLLOWS),
        Knob(
            "serving_workers",
            1,
            _serving_workers,
            default=1,
            fits=_workers_fit,
            rule_given=_workers_rule,
            follows=SERVING_FOLLOWS,
        ),
        Knob(
            "serving_allocator",
            0,
            _serving_allocator,
            choices=("glibc", "jemalloc"),
            stock="glibc",
            follows=SERVING_FOLLOWS,
        ),
        Knob("thp_enabled", 0, _none, choices=("always", "madvise", "never"), sysfs=THP_ENABLED, override="plan_thp"),
        Knob(
            "thp_defrag",
            0,
            _none,
            choices=("always", "defer", "defer+madvise", "madvise", "never"),
            sysfs=THP_DEFRAG,
            override="plan_thp_defrag",
        ),
    )
}


# The role variables that outrank a plan value tune may keep, in the order they do: set for the host,
# `up` applies the variable, not a kept plan_* value, so the knob is not searched. Role serving's
# serving_jemalloc gives the model server's allocator; role thread_env's own count of a pool gives it,
# and its thread count (thread_env_threads, where it differs from the plan's) gives Polars', joblib's
# and the DataLoader's counts, as its DataLoader threads give the split.
OUTRANKING: dict[str, tuple[str, ...]] = {
    "serving_allocator": ("serving_jemalloc",),
    "polars_threads": ("thread_env_polars_threads", "thread_env_threads"),
    "joblib_workers": ("thread_env_joblib_workers", "thread_env_threads"),
    "arrow_io_threads": ("thread_env_arrow_io_threads",),
    "tf_inter_op_threads": ("thread_env_tf_inter_op_threads",),
    "dataloader_workers": ("thread_env_dataloader_workers", "thread_env_dataloader_threads", "thread_env_threads"),
    "trials": ("thread_env_trials",),
}


def outranked(role_vars: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Plan value -> [the role variable set for the host (ROLE_VARS: name -> value) that outranks it, the
    value it gives that plan value, or None where it sets another count (the plan's value stays)]."""
    out: dict[str, list[Any]] = {}
    for knob, names in OUTRANKING.items():
        name = next((n for n in names if n in role_vars), None)
        if name is None:
            continue
        value = role_vars[name]
        if knob == "serving_allocator":
            given: Any = "jemalloc" if str(value).strip().lower() in ("true", "yes", "on", "1") else "glibc"
        else:
            given = int(value) if name == f"thread_env_{knob}" else None
        out[knob] = [name, given]
    return out


@dataclass(frozen=True)
class Candidate:
    value: Any
    env: Env
    default: bool = False  # the library's own default count
    live: Live = ()  # a kernel knob's file and value, written before each of its measurements

    @property
    def label(self) -> str:
        return f"{self.value} (library default)" if self.default else str(self.value)


def candidates(
    name: str,
    rule: Any,
    cores: int,
    logical: int | None = None,
    allow_oversubscription: bool = False,
    kept: Env | None = None,
    plan: Mapping[str, Any] | None = None,
) -> list[Candidate]:
    """The values tune measures against the rule (the plan's value), the rule itself left out: every
    count from the knob's lowest to the cores (the DataLoader's workers to one less), and the library's default where it is not one of them
    (with more logical CPUs than cores, only with allow_oversubscription; a pool of threads that wait on a
    drive: the powers of two and the cores, to twice its own count whatever the cores). A knob sharing the cores
    with another: only the counts that fit beside KEPT (the variables kept before it) and the PLAN,
    unless oversubscription is allowed."""
    knob = KNOBS[name]
    if knob.choices:
        return [Candidate(v, knob.env(v, cores), default=v == knob.stock, live=knob.live(v)) for v in knob.choices if v != rule]
    # Worker processes next to a training thread: at most cores - 1 of them, as the plan allows
    # (plan_dataloader_workers), unless oversubscription is.
    top = cores - 1 if knob.lowest == 0 and not allow_oversubscription else cores
    values = [v for v in range(knob.lowest, top + 1) if v != rule]
    if knob.waits:  # each measurement of such a pool reads a drive cold: a few counts, spread out
        top = max(cores, 2 * (knob.default or 1))
        values = sorted(({1 << i for i in range(top.bit_length())} | {cores}) - {rule})
    if knob.default is None and logical is not None and logical > cores and allow_oversubscription:
        values.append(logical)  # the library's default count (the logical CPUs), as a value the plan can carry back
    if knob.fits is not None and plan is not None:
        fits = knob.fits
        values = [v for v in values if fits(v, kept or {}, plan, cores, allow_oversubscription)]
    default = knob.default if knob.default is not None else logical if logical is not None and logical > cores else None
    return [Candidate(v, knob.env(v, cores), default=v == default) for v in values]


def searchable(declared: Sequence[str]) -> list[str]:
    """The knobs of a workload's KNOBS that tune can apply, in the workload's order."""
    return [k for k in declared if k in KNOBS]
