"""The tuning plan: pure functions from hardware facts to settings, each with its reason.

Input: the ``provisioner_hardware`` facts (schema 1, gathered on the target by
plugins/modules/provisioner_facts.py) and :class:`PlanOptions` (the ``plan_*`` variables).
Output: a :class:`Plan`; its ``to_dict()`` is what the CLI prints and what the roles receive
as the ``provisioner_plan`` fact (they read ``values``).  No I/O here.

Every rule, its reason and its source are written out in docs/tuning.md; each function below
cites its section, and each setting's reason names the same source in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from provisioner.constants import (
    HUGEPAGES_SIZES,
    MAX_HUGEPAGES_SHARE,
    MAX_SERVING_MEMORY_SHARE,
    MD_CHUNK_KB,
    MIN_DRIVES,
    READ_AHEAD_KB,
    SERVING_MEMORY_SHARE,
    SERVING_WORKER_OVERHEAD_BYTES,
    STORAGE_BACKENDS,
    STORAGE_LEVELS,
    SYSTEM_DIRECTORIES,
    THP_CHOICES,
    TUNED_PROFILES,
)
from provisioner.errors import BadInput

FACTS_SCHEMA = 1
GIB = 1024**3

# Arrow's own IO pool size (arrow/util/io_util: 8 threads unless ARROW_IO_THREADS says otherwise).
ARROW_IO_THREADS = 8
# Features of the float32 matrix the plan sizes when plan_feature_matrix_features is not given.
FEATURE_MATRIX_FEATURES = 200
FLOAT32_BYTES = 4
# RAM kept free next to the largest feature matrix: a share of the RAM left after hugepages, and
# at least a floor (the kernel, the page cache of the data being read, the process itself).
FEATURE_MATRIX_MARGIN_SHARE = 0.2
FEATURE_MATRIX_MARGIN_MIN_BYTES = 2 * GIB
# Ray (docs/ray.md, 'Sizing'): the object store's share of the RAM left after hugepages (Ray's own
# default is 30% of the available memory), the most a share may be, and Ray's smallest store.
RAY_OBJECT_STORE_SHARE = 0.3
MAX_RAY_OBJECT_STORE_SHARE = 0.6
RAY_MIN_OBJECT_STORE_BYTES = 75 * 1024**2
# RAM kept out of Ray's task memory for the system and Ray's own processes: a share, and a floor.
RAY_SYSTEM_SHARE = 0.1
RAY_SYSTEM_MIN_BYTES = GIB


class PlanError(BadInput):
    """Bad options or facts: refused before any host is touched (exit code 2)."""


# --------------------------------------------------------------------------
# options
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanOptions:
    """The ``plan_*`` variables, validated.  Field ``x`` is the variable ``plan_x``.

    The limits checked here (trials, hugepages share, data mount point) are explained in
    docs/tuning.md, 'Threads', 'Hugepages' and 'Data mount'.
    """

    trials: int | None = None
    allow_oversubscription: bool = False
    thp: str = "madvise"
    hugepages_size: str | None = None
    hugepages_count: int = 0
    hugepages_share: float = 0.0
    tuned_profile: str = "throughput-performance"
    data_mountpoint: str = "/data"
    storage_level: str = "raid0"
    storage_backend: str = "mdadm"
    storage_devices: tuple[str, ...] = ()
    serving_workers: int | None = None
    serving_threads_per_worker: int | None = None
    serving_memory_share: float = SERVING_MEMORY_SHARE
    dataloader_workers: int | None = None
    feature_matrix_features: int = FEATURE_MATRIX_FEATURES
    feature_matrix_rows: int | None = None
    ray_object_store_share: float = RAY_OBJECT_STORE_SHARE

    def __post_init__(self) -> None:
        if self.trials is not None and self.trials < 1:
            raise PlanError(f"plan_trials must be 1 or more (got {self.trials})")
        if self.dataloader_workers is not None and self.dataloader_workers < 0:
            raise PlanError(f"plan_dataloader_workers must be 0 or more (got {self.dataloader_workers})")
        if self.feature_matrix_features < 1:
            raise PlanError(f"plan_feature_matrix_features must be 1 or more (got {self.feature_matrix_features})")
        if self.feature_matrix_rows is not None and self.feature_matrix_rows < 1:
            raise PlanError(f"plan_feature_matrix_rows must be 1 or more (got {self.feature_matrix_rows})")
        if self.thp not in THP_CHOICES:
            raise PlanError(f"plan_thp must be one of {', '.join(THP_CHOICES)} (got {self.thp!r})")
        if self.hugepages_size is not None and self.hugepages_size not in HUGEPAGES_SIZES:
            raise PlanError(f"plan_hugepages_size must be null, 2M or 1G (got {self.hugepages_size!r})")
        if self.hugepages_count < 0:
            raise PlanError(f"plan_hugepages_count must be 0 or more (got {self.hugepages_count})")
        if not 0.0 <= self.hugepages_share <= MAX_HUGEPAGES_SHARE:
            raise PlanError(f"plan_hugepages_share must be between 0 and {MAX_HUGEPAGES_SHARE} (got {self.hugepages_share})")
        if self.hugepages_count and self.hugepages_share:
            raise PlanError("set plan_hugepages_count or plan_hugepages_share, not both")
        if (self.hugepages_count or self.hugepages_share) and self.hugepages_size is None:
            raise PlanError("plan_hugepages_count/plan_hugepages_share need plan_hugepages_size: 2M or 1G")
        if self.tuned_profile not in TUNED_PROFILES:
            raise PlanError(f"plan_tuned_profile must be one of {', '.join(TUNED_PROFILES)} (got {self.tuned_profile!r})")
        if not self.data_mountpoint.startswith("/") or (self.data_mountpoint.rstrip("/") or "/") in SYSTEM_DIRECTORIES:
            raise PlanError(
                f"plan_data_mountpoint must be an absolute path of its own, like /data (got {self.data_mountpoint!r})"
            )
        if self.storage_level not in STORAGE_LEVELS:
            raise PlanError(f"plan_storage_level must be one of {', '.join(STORAGE_LEVELS)} (got {self.storage_level!r})")
        if self.storage_backend not in STORAGE_BACKENDS:
            raise PlanError(f"plan_storage_backend must be one of {', '.join(STORAGE_BACKENDS)} (got {self.storage_backend!r})")
        for name in ("serving_workers", "serving_threads_per_worker"):
            count = getattr(self, name)
            if count is not None and count < 1:
                raise PlanError(f"plan_{name} must be 1 or more (got {count})")
        if not 0.0 < self.serving_memory_share <= MAX_SERVING_MEMORY_SHARE:
            raise PlanError(
                f"plan_serving_memory_share must be above 0 and at most {MAX_SERVING_MEMORY_SHARE} "
                f"(got {self.serving_memory_share})"
            )

        if not 0.0 < self.ray_object_store_share <= MAX_RAY_OBJECT_STORE_SHARE:
            raise PlanError(
                f"plan_ray_object_store_share must be above 0 and at most {MAX_RAY_OBJECT_STORE_SHARE} "
                f"(got {self.ray_object_store_share})"
            )

    @classmethod
    def known_vars(cls) -> tuple[str, ...]:
        return tuple(f"plan_{f.name}" for f in fields(cls))

    @classmethod
    def from_vars(cls, variables: Mapping[str, Any]) -> PlanOptions:
        """Read the ``plan_*`` keys of ``variables`` (other keys are ignored).

        Values may be strings (``-e plan_trials=8``); null or "" means the default.
        An unknown ``plan_*`` key (a typo) is refused, naming the known ones.
        """
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(k for k in variables if k.startswith("plan_") and k[5:] not in known)
        if unknown:
            raise PlanError(f"unknown plan option {', '.join(unknown)}; known: {', '.join(cls.known_vars())}")
        kwargs: dict[str, Any] = {}
        for name in known:
            key = f"plan_{name}"
            if key not in variables:
                continue
            value = variables[key]
            if value is None or (isinstance(value, str) and value.strip() in ("", "null", "None")):
                continue
            kwargs[name] = _COERCE[name](key, value)
        return cls(**kwargs)


def _as_int(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise PlanError(f"{key} must be a whole number (got {value!r})")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return int(str(value).strip())
    except ValueError:
        raise PlanError(f"{key} must be a whole number (got {value!r})") from None


def _as_float(key: str, value: Any) -> float:
    if isinstance(value, bool):
        raise PlanError(f"{key} must be a number (got {value!r})")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise PlanError(f"{key} must be a number (got {value!r})") from None


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise PlanError(f"{key} must be true or false (got {value!r})")


def _as_str(key: str, value: Any) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise PlanError(f"{key} must be a string (got {value!r})")
    return str(value).strip()


def _as_hugepages_size(key: str, value: Any) -> str:
    text = _as_str(key, value).upper().replace("IB", "").replace("B", "")
    aliases = {"2M": "2M", "2048K": "2M", "1G": "1G", "1024M": "1G"}
    if text not in aliases:
        raise PlanError(f"{key} must be null, 2M or 1G (got {value!r})")
    return aliases[text]


def _as_str_tuple(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v for v in value.replace(",", " ").split() if v]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise PlanError(f"{key} must be a list of device paths (got {value!r})")
    return tuple(v.strip() for v in value)


_COERCE: dict[str, Callable[[str, Any], Any]] = {
    "trials": _as_int,
    "allow_oversubscription": _as_bool,
    "thp": lambda k, v: _as_str(k, v).lower(),
    "hugepages_size": _as_hugepages_size,
    "hugepages_count": _as_int,
    "hugepages_share": _as_float,
    "tuned_profile": _as_str,
    "data_mountpoint": _as_str,
    "storage_level": lambda k, v: _as_str(k, v).lower(),
    "storage_backend": lambda k, v: _as_str(k, v).lower(),
    "storage_devices": _as_str_tuple,
    "serving_workers": _as_int,
    "serving_threads_per_worker": _as_int,
    "serving_memory_share": _as_float,
    "dataloader_workers": _as_int,
    "feature_matrix_features": _as_int,
    "feature_matrix_rows": _as_int,
    "ray_object_store_share": _as_float,
}


# --------------------------------------------------------------------------
# the plan
# --------------------------------------------------------------------------


@dataclass
class Setting:
    key: str
    value: Any
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "reason": self.reason}


@dataclass
class Plan:
    settings: list[Setting] = field(default_factory=list)
    storage: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    serving: dict[str, Any] | None = None

    def value(self, key: str) -> Any:
        for setting in self.settings:
            if setting.key == key:
                return setting.value
        raise KeyError(f"no setting {key!r} in the plan; have: {', '.join(self.keys())}")

    def reason(self, key: str) -> str:
        for setting in self.settings:
            if setting.key == key:
                return setting.reason
        raise KeyError(f"no setting {key!r} in the plan")

    def keys(self) -> list[str]:
        return [s.key for s in self.settings]

    def to_dict(self) -> dict[str, Any]:
        return {
            "settings": [s.to_dict() for s in self.settings],
            "values": {s.key: s.value for s in self.settings},
            "storage": self.storage,
            "serving": self.serving,
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        return cls(
            settings=[Setting(s["key"], s["value"], s["reason"]) for s in data.get("settings", [])],
            storage=data.get("storage"),
            warnings=list(data.get("warnings", [])),
            serving=data.get("serving"),
        )


# --------------------------------------------------------------------------
# facts access
# --------------------------------------------------------------------------


def _need(facts: Mapping[str, Any], path: str) -> Any:
    node: Any = facts
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise PlanError(f"hardware facts lack {path}; gather them with the provisioner_facts module (schema {FACTS_SCHEMA})")
        node = node[part]
    return node


def _get(facts: Mapping[str, Any], path: str, default: Any = None) -> Any:
    node: Any = facts
    for part in path.split("."):
        if not isinstance(node, Mapping) or node.get(part) is None:
            return default
        node = node[part]
    return node


def check_facts(facts: Any) -> None:
    if not isinstance(facts, Mapping):
        raise PlanError("no hardware facts: run the provisioner_facts module (role plan) first")
    schema = facts.get("schema")
    if schema != FACTS_SCHEMA:
        raise PlanError(
            f"hardware facts have schema {schema!r}, this plan reads schema {FACTS_SCHEMA}; "
            "gather them again with this version's provisioner_facts"
        )


def _human_bytes(size: int) -> str:
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6)):
        if size >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size} B"


def _gib(size: float) -> str:
    return f"{size / GIB:.1f} GiB"


# --------------------------------------------------------------------------
# one function per concern; each returns settings and may add warnings
# --------------------------------------------------------------------------


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
        if trials > cores and not options.allow_oversubscription:
            raise PlanError(
                f"plan_trials={trials} is more than the {cores} physical cores; oversubscription "
                "collapses throughput: lower plan_trials or set plan_allow_oversubscription: true"
            )
        trials_reason = f"{trials}: plan_trials"
        if trials > cores:
            trials_reason += f", above {cores} physical cores (plan_allow_oversubscription: true)"
            warnings.append(
                f"{trials} parallel trials on {cores} physical cores: oversubscribed by choice (plan_allow_oversubscription)"
            )
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


def plan_runtime_threads(facts: Mapping[str, Any], options: PlanOptions, warnings: list[str]) -> list[Setting]:
    """The thread pools of the other runtimes for one job: Polars, Arrow, TensorFlow, PyTorch's
    inter-op pool, joblib/loky.  See docs/tuning.md, 'Threads' ('Other runtimes').

    Each of them sizes its pool from the logical CPUs when nothing says otherwise (SMT counted),
    and each process of N parallel ones does so again: the counts here are for one job, and
    ml-env --trials N gives each trial the same share of every one as of the cores."""
    cores = _need(facts, "cpu.cores")
    sockets = _get(facts, "cpu.sockets", 1)
    if not isinstance(sockets, int) or sockets < 1:
        sockets = 1
    inter = min(sockets, cores)
    per_socket = "one per socket" if sockets > 1 else "one socket"
    return [
        Setting(
            "polars_threads",
            cores,
            f"{cores}: POLARS_MAX_THREADS = threads_per_job; Polars sizes its pool once, at first use, "
            "from the logical CPUs otherwise (Polars docs)",
        ),
        Setting(
            "arrow_cpu_threads",
            cores,
            f"{cores}: Arrow's CPU pool reads OMP_NUM_THREADS (threads_per_job), else the logical CPUs; "
            "pyarrow.set_cpu_count() per process (Arrow docs, thread pools)",
        ),
        Setting(
            "arrow_io_threads",
            ARROW_IO_THREADS,
            f"{ARROW_IO_THREADS}: ARROW_IO_THREADS, Arrow's own default; IO threads wait on the drive, "
            "not on a core, so they are not sized by the cores (Arrow docs, thread pools)",
        ),
        Setting(
            "tf_intra_op_threads",
            cores,
            f"{cores}: TF_NUM_INTRAOP_THREADS = threads_per_job; TensorFlow's default is every schedulable "
            "CPU, SMT counted (tensorflow process_util.cc; Intel TensorFlow tuning guide)",
        ),
        Setting(
            "tf_inter_op_threads",
            inter,
            f"{inter}: TF_NUM_INTEROP_THREADS, {per_socket}: independent ops run side by side, each on the "
            "intra-op pool; TensorFlow's default is every CPU again (Intel TensorFlow tuning guide)",
        ),
        Setting(
            "torch_interop_threads",
            inter,
            f"{inter}: {per_socket}, as for TensorFlow; torch reads no variable for it, so it reaches a "
            "process as PROVISIONER_TORCH_INTEROP_THREADS for torch.set_num_interop_threads(), called "
            "before any parallel work (PyTorch CPU threading docs)",
        ),
        Setting(
            "joblib_workers",
            cores,
            f"{cores}: LOKY_MAX_CPU_COUNT caps joblib.cpu_count(), so n_jobs=-1 starts one worker per "
            "physical core, not per logical CPU (loky cpu_count; scikit-learn parallelism docs)",
        ),
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


def _ram(facts: Mapping[str, Any]) -> Any:
    """The host's RAM as the plan sizes by it: the memory the kernel has online in its memory
    blocks where it reports them (the same from one boot to the next), else MemTotal. MemTotal
    moves with what the kernel keeps at boot, which the kernel command line changes (the 1 GiB
    pages role hugepages puts there among it), and a plan sized by it would differ after the
    reboot that applies them, so a converged host's first run after it would rewrite the plan."""
    total = _need(facts, "memory.total_bytes")
    installed = _get(facts, "memory.installed_bytes")
    if isinstance(total, int) and isinstance(installed, int) and installed >= total > 0:
        return installed
    return total


def _memory_and_hugepages(facts: Mapping[str, Any], settings: list[Setting], what: str) -> tuple[int, int]:
    """The host's RAM (_ram) and the bytes the plan's hugepages settings reserve of it; no memory
    size in the facts is refused, naming WHAT could not be sized."""
    total = _ram(facts)
    if not isinstance(total, int) or total <= 0:
        raise PlanError(f"hardware facts report no memory size; cannot size {what}")
    page_bytes = {"hugepages_2m": 2 * 1024**2, "hugepages_1g": GIB}
    return total, sum(int(st.value or 0) * page_bytes[st.key] for st in settings if st.key in page_bytes)


def plan_feature_matrix(
    facts: Mapping[str, Any], options: PlanOptions, settings: list[Setting], warnings: list[str]
) -> list[Setting]:
    """The largest float32 feature matrix this host holds in RAM without swapping.
    See docs/tuning.md, 'Memory' ('Feature matrix')."""
    total, reserved = _memory_and_hugepages(facts, settings, "the feature matrix")
    after = total - reserved
    margin = max(FEATURE_MATRIX_MARGIN_MIN_BYTES, int(after * FEATURE_MATRIX_MARGIN_SHARE))
    budget = after - margin
    features = options.feature_matrix_features
    row_bytes = features * FLOAT32_BYTES
    largest = max(0, budget) // row_bytes
    ram = f"{_gib(total)} RAM" + (f" - {_gib(reserved)} hugepages" if reserved else "")
    limit = (
        f"{_gib(max(budget, 0))} ({ram} - a margin of {_gib(margin)}: "
        f"{FEATURE_MATRIX_MARGIN_SHARE:.0%}, at least {_gib(FEATURE_MATRIX_MARGIN_MIN_BYTES)})"
    )
    if largest < 1:
        raise PlanError(
            f"no float32 row of {features} features fits in {limit}; lower plan_hugepages_count or plan_hugepages_share"
        )
    if options.feature_matrix_rows is not None:
        rows = options.feature_matrix_rows
        if rows > largest:
            raise PlanError(
                f"plan_feature_matrix_rows={rows} x {features} features x 4 B = {_gib(rows * row_bytes)} does not "
                f"fit in the {limit} this host holds without swapping (at most {largest} rows); lower "
                "plan_feature_matrix_rows or plan_feature_matrix_features"
            )
        rows_reason = f"{rows}: plan_feature_matrix_rows, {rows * row_bytes / max(budget, 1):.0%} of {limit}"
    else:
        rows = largest
        rows_reason = f"{rows}: the most rows of {features} float32 features that fit in {limit}"
    return [
        Setting("feature_matrix_rows", rows, rows_reason + "; the rest stays for the kernel, page cache and the process"),
        Setting(
            "feature_matrix_features",
            features,
            f"{features}: plan_feature_matrix_features" + (" (default)" if features == FEATURE_MATRIX_FEATURES else ""),
        ),
        Setting(
            "feature_matrix_bytes",
            rows * row_bytes,
            f"{rows * row_bytes}: {rows} rows x {features} features x 4 B = {_gib(rows * row_bytes)} "
            "(one copy; a library that copies it needs room for two)",
        ),
    ]


def plan_thp(facts: Mapping[str, Any], options: PlanOptions, warnings: list[str]) -> list[Setting]:
    """Transparent huge pages.  See docs/tuning.md, 'Transparent huge pages'."""
    reasons = {
        "madvise": "madvise: numpy asks for huge pages on arrays >= 4 MB (madvise); always can bloat "
        "memory (kernel transhuge docs; pytorch PR 115990)",
        "always": "always: plan_thp=always, for a dedicated box; every anonymous region gets huge pages, "
        "which can bloat memory (kernel transhuge docs)",
        "never": "never: plan_thp=never; numpy and torch lose huge pages on large arrays (kernel transhuge docs)",
    }
    if options.tuned_profile == "hpc-compute" and options.thp != "always":
        warnings.append(
            f"tuned profile hpc-compute sets THP=always; the plan keeps plan_thp={options.thp} "
            "(set plan_thp: always to follow the profile)"
        )
    current = _get(facts, "thp.enabled")
    enabled_reason = reasons[options.thp]
    if current is None:
        enabled_reason += "; the kernel shows no THP controls, so this is not applicable there"
    return [
        Setting("thp_enabled", options.thp, enabled_reason),
        Setting(
            "thp_defrag",
            "madvise",
            "madvise: only regions that asked for huge pages stall for compaction (kernel transhuge docs)",
        ),
    ]


def plan_hugepages(facts: Mapping[str, Any], options: PlanOptions, warnings: list[str]) -> list[Setting]:
    """Explicit hugepages (2M at run time, 1G on the kernel command line).  See docs/tuning.md, 'Hugepages'."""
    none_reason = (
        "0: no named consumer uses hugetlbfs; numpy and torch use anonymous memory (THP), and reserved "
        "pages are lost to everything else (RHEL performance tuning guide)"
    )
    pages_2m = Setting("hugepages_2m", 0, none_reason)
    pages_1g = Setting("hugepages_1g", 0, none_reason)
    size = options.hugepages_size
    if size is None or not (options.hugepages_count or options.hugepages_share):
        if size is not None:
            warnings.append(f"plan_hugepages_size={size} without plan_hugepages_count or _share reserves nothing")
        return [pages_2m, pages_1g]

    total = _ram(facts)
    if not isinstance(total, int) or total <= 0:
        raise PlanError("hardware facts report no memory size; cannot size hugepages")
    page_bytes = 2 * 1024**2 if size == "2M" else GIB
    if size == "1G" and not _get(facts, "memory.hugepages_1g_supported", False):
        raise PlanError("plan_hugepages_size=1G but this CPU/kernel has no 1 GiB pages (no pdpe1gb); use 2M")
    if options.hugepages_count:
        count = options.hugepages_count
        how = f"plan_hugepages_count={count}"
    else:
        count = int(total * options.hugepages_share // page_bytes)
        how = f"plan_hugepages_share={options.hugepages_share:g} of {_gib(total)}"
    reserved = count * page_bytes
    if reserved > MAX_HUGEPAGES_SHARE * total:
        raise PlanError(
            f"plan_hugepages: {count} x {size} = {_gib(reserved)} is more than "
            f"{MAX_HUGEPAGES_SHARE:.0%} of the {_gib(total)} of RAM; lower the count or share"
        )
    reason = f"{count}: {how} = {_gib(reserved)} reserved for hugetlbfs consumers, lost to everything else"
    if size == "2M":
        pages_2m = Setting("hugepages_2m", count, reason + " (vm.nr_hugepages, at run time)")
    else:
        pages_1g = Setting(
            "hugepages_1g",
            count,
            reason + "; 1 GiB pages are reserved on the kernel command line only, so this needs a "
            "reboot (kernel hugetlbpage docs)",
        )
    if reserved > 0.5 * total:
        warnings.append(f"hugepages reserve {_gib(reserved)} of {_gib(total)} RAM; numpy/torch cannot use it")
    return [pages_2m, pages_1g]


def plan_reboot(settings: list[Setting]) -> Setting:
    """What needs a reboot to take effect; the roles report it and never reboot on their own.
    See docs/tuning.md, 'Reboots'."""
    needs = [s.key for s in settings if s.key == "hugepages_1g" and s.value]
    if needs:
        return Setting("reboot_required_for", needs, f"{', '.join(needs)}: kernel command line only")
    return Setting("reboot_required_for", [], "nothing in this plan needs a reboot")


def plan_cpufreq(facts: Mapping[str, Any], options: PlanOptions, warnings: list[str]) -> list[Setting]:
    """Governor, EPP, boost.  See docs/tuning.md, 'CPU frequency'."""
    driver = _get(facts, "cpufreq.driver")
    virt = _get(facts, "virtualization.vm") or _get(facts, "virtualization.type", "none")
    if not driver:
        why = "not applicable: no cpufreq driver"
        if virt not in (None, "none"):
            why += f" ({virt} guest: the host sets the clocks)"
        return [
            Setting("cpu_governor", None, why),
            Setting("energy_performance_preference", None, why),
            Setting("cpu_boost", None, why),
        ]
    available = _get(facts, "cpufreq.available_governors", []) or []
    if available and "performance" not in available:
        governor = Setting(
            "cpu_governor", None, f"not applicable: driver {driver} offers no performance governor ({', '.join(available)})"
        )
    else:
        governor = Setting(
            "cpu_governor",
            "performance",
            f"performance: full clocks under bursty load (kernel amd-pstate docs); driver {driver}",
        )
    if _get(facts, "cpufreq.epp") is not None:
        epp = Setting(
            "energy_performance_preference",
            "performance",
            f"performance: {driver} has EPP; favour clocks over power (kernel amd-pstate docs)",
        )
    else:
        epp = Setting("energy_performance_preference", None, f"not applicable: driver {driver} has no EPP")
    if driver == "amd-pstate" and _get(facts, "cpufreq.amd_pstate_status") not in (None, "active"):
        warnings.append("amd-pstate is not in active mode (amd_pstate=active on the kernel command line gives EPP)")
    if _get(facts, "cpufreq.boost") is None:
        boost = Setting("cpu_boost", None, f"not applicable: driver {driver} exposes no boost control")
    else:
        boost = Setting("cpu_boost", True, "true: boost on for full clocks (kernel amd-pstate docs)")
    return [governor, epp, boost]


TUNED_REASONS = {
    "throughput-performance": "sets governor, EPP, min_perf_pct=100, swappiness 10, readahead >= 4096 KiB",
    "hpc-compute": "throughput-performance plus THP=always, numa_balancing=0, zone_reclaim_mode=1",
    "latency-performance": "for inference endpoints: governor performance and no deep C-states; less throughput tuning",
}


def plan_os(facts: Mapping[str, Any], options: PlanOptions, warnings: list[str]) -> list[Setting]:
    """tuned profile, swappiness, NUMA balancing.  See docs/tuning.md, 'Operating system'."""
    profile = options.tuned_profile
    default = " (default)" if profile == "throughput-performance" else " (plan_tuned_profile)"
    settings = [
        Setting(
            "tuned_profile",
            profile,
            f"{profile}{default}: {TUNED_REASONS[profile]} (redhat-performance/tuned profiles)",
        ),
        Setting("swappiness", 10, "10: keep anonymous ML memory resident (tuned throughput-performance)"),
    ]
    nodes = _get(facts, "cpu.numa_nodes", 1)
    reasons = {
        None: "not applicable: 1 NUMA node",
        0: f"0: {nodes} NUMA nodes, tuned hpc-compute pins instead of migrating",
        1: f"1: {nodes} NUMA nodes; the kernel moves memory to unpinned jobs (pin per node "
        "only for pinned jobs; AMD EPYC tuning guides)",
    }
    value = numa_balancing(nodes, profile)
    settings.append(Setting("numa_balancing", value, reasons[value]))
    return settings


def numa_balancing(nodes: int, profile: str) -> int | None:
    """kernel.numa_balancing for NODES NUMA nodes under tuned PROFILE: None (left alone) on one
    node, 0 where hpc-compute pins, else 1.  cpu_tuning's standalone default applies this rule
    through the filter provisioner_numa_balancing."""
    if nodes <= 1:
        return None
    return 0 if profile == "hpc-compute" else 1


def plan_runtimes(facts: Mapping[str, Any], options: PlanOptions, warnings: list[str]) -> list[Setting]:
    """BLAS, OpenMP runtime, KMP_*, binding, allocator.  See docs/tuning.md, 'Runtimes'."""
    vendor = _get(facts, "cpu.vendor", "unknown")
    if vendor == "AuthenticAMD":
        blas = Setting(
            "blas",
            "openblas",
            "openblas: OpenBLAS has Zen 4 AVX-512 kernels; MKL only as a measured opt-in, since "
            "MKL_DEBUG_CPU_TYPE was removed in MKL 2020.1 and MKL_ENABLE_INSTRUCTIONS does nothing on "
            "AMD (OpenBLAS PR 4303; Intel oneMKL docs)",
        )
    elif vendor == "GenuineIntel":
        blas = Setting(
            "blas",
            "mkl",
            "mkl: torch bundles MKL and oneDNN on Intel; numpy/scipy wheels keep their OpenBLAS "
            "(blas_numpy); scikit-learn-intelex optional (Intel docs)",
        )
    else:
        blas = Setting("blas", "openblas", f"openblas: no vendor BLAS for {vendor}; numpy/scipy wheels bundle it")
    return [
        blas,
        Setting("blas_numpy", "openblas", "openblas: the BLAS bundled in the numpy/scipy wheels"),
        Setting(
            "openmp_runtime",
            "libgomp",
            "libgomp: the GNU OpenMP of the torch, xgboost, lightgbm and OpenBLAS wheels; one runtime, "
            "never libgomp and libiomp mixed (threadpoolctl warns)",
        ),
        Setting(
            "kmp_blocktime",
            None,
            "not applicable: KMP_BLOCKTIME/KMP_AFFINITY only where Intel OpenMP (libiomp) is the runtime (IPEX tuning guide)",
        ),
        Setting(
            "omp_proc_bind",
            None,
            "not exported system-wide: OMP_PROC_BIND=close/OMP_PLACES=cores only for a single pinned job, "
            "or every process pins to the same cores (PyTorch tuning guide)",
        ),
        Setting(
            "allocator",
            None,
            "system malloc: jemalloc/tcmalloc via LD_PRELOAD is an opt-in per service (PyTorch tuning guide)",
        ),
    ]


# --------------------------------------------------------------------------
# storage proposal
# --------------------------------------------------------------------------


def stable_id(device: Mapping[str, Any]) -> tuple[str, bool]:
    """The name to use for a drive: a /dev/disk/by-id link (facts sort them best first), else the
    kernel path.  Returns (path, stable).  See docs/tuning.md, 'Which drives'."""
    by_id = [link for link in device.get("by_id") or [] if "-part" not in link]
    if by_id:
        return by_id[0], True
    return device.get("path") or f"/dev/{device['name']}", False


def exclusion_reason(device: Mapping[str, Any], explicit: bool = False) -> str | None:
    """Why a drive is not free for a new data array, or None when it is.
    See docs/tuning.md, 'Which drives'."""
    if device.get("root_disk"):
        return "root disk: holds /, /boot or /boot/efi"
    if device.get("mounted") or device.get("mountpoints"):
        return f"mounted at {', '.join(device.get('mountpoints') or ['?'])}"
    if device.get("holders"):
        return f"in use by {', '.join(device['holders'])}"
    if device.get("partitions"):
        return f"has partitions ({', '.join(device['partitions'])})"
    if device.get("signatures"):
        return f"has a signature ({', '.join(device['signatures'])}): may hold data"
    if device.get("signature_probe") == "failed":
        return "could not be probed for signatures (blkid -p failed): may hold data"
    if device.get("read_only"):
        return "read-only"
    if device.get("removable"):
        return "removable"
    if not explicit:
        if device.get("loop"):
            return "loop device (name it in plan_storage_devices to use it)"
        if not device.get("nvme"):
            kind = "rotational" if device.get("rotational") else "SATA/SAS/virtual"
            return f"not NVMe ({kind}; name it in plan_storage_devices to use it)"
    if not device.get("size_bytes"):
        return "size 0"
    return None


def _find_device(devices: list[Mapping[str, Any]], wanted: str) -> Mapping[str, Any] | None:
    bare = wanted[len("/dev/") :] if wanted.startswith("/dev/") and "/" not in wanted[5:] else None
    for device in devices:
        names = {device.get("path"), device.get("name"), *(device.get("by_id") or [])}
        if wanted in names or (bare and bare == device.get("name")):
            return device
    return None


def plan_storage(facts: Mapping[str, Any], options: PlanOptions, warnings: list[str]) -> dict[str, Any]:
    """A proposal for the data array.  Never confirmed here: the storage role builds nothing
    until the user confirms; drives in any use are never proposed.  See docs/tuning.md,
    'Storage' ('Which drives', 'Level and backend', 'Layout')."""
    devices = list(_get(facts, "block_devices", []) or [])
    level, backend = options.storage_level, options.storage_backend
    excluded: list[dict[str, Any]] = []
    candidates: list[Mapping[str, Any]] = []

    if options.storage_devices:
        for wanted in options.storage_devices:
            device = _find_device(devices, wanted)
            if device is None:
                raise PlanError(f"plan_storage_devices: {wanted} is not a block device on this host")
            why = exclusion_reason(device, explicit=True)
            if why:
                raise PlanError(f"plan_storage_devices: refusing {wanted}: {why}")
            candidates.append(device)
        for device in devices:
            if device not in candidates and not device.get("loop"):
                why = exclusion_reason(device) or "not in plan_storage_devices"
                excluded.append({"name": device["name"], "path": device.get("path"), "reason": why})
    else:
        # Loop devices are files, not drives: never proposed, and not worth listing (they come
        # and go with other software on the host, which would make the plan itself change).
        for device in (d for d in devices if not d.get("loop")):
            why = exclusion_reason(device)
            if why:
                excluded.append({"name": device["name"], "path": device.get("path"), "reason": why})
            else:
                candidates.append(device)

    candidates.sort(key=lambda d: stable_id(d)[0])
    if level == "single" and backend == "mdadm" and len(candidates) > 1:
        for device in candidates[1:]:
            excluded.append({"name": device["name"], "path": device.get("path"), "reason": "level single uses one drive"})
        candidates = candidates[:1]

    filesystem = "btrfs" if backend == "btrfs" else "xfs"
    proposal: dict[str, Any] = {
        "proposed": False,
        "confirmed": False,
        "level": level,
        "backend": backend,
        "filesystem": filesystem,
        "chunk_kb": MD_CHUNK_KB if backend == "mdadm" and level != "single" else None,
        "mountpoint": options.data_mountpoint,
        "mount_options": ["noatime", "nofail"],
        "read_ahead_kb": READ_AHEAD_KB,
        "scheduler": "none",
        "devices": [],
        "excluded": excluded,
        "usable_bytes": 0,
        "reason": "",
    }
    need = MIN_DRIVES[level]
    if len(candidates) < need:
        found = (
            f"{len(candidates)} unused NVMe data drive(s)" if not options.storage_devices else f"{len(candidates)} drive(s) named"
        )
        proposal["reason"] = f"nothing proposed: {level} needs {need} drive(s), found {found}"
        return proposal

    members = []
    for device in candidates:
        path, stable = stable_id(device)
        if not stable:
            warnings.append(f"{device['name']} has no /dev/disk/by-id link; its kernel name may change across reboots")
        members.append(
            {"id": path, "name": device["name"], "size_bytes": device.get("size_bytes", 0), "model": device.get("model")}
        )
    sizes = [m["size_bytes"] for m in members]
    smallest = min(sizes)
    if max(sizes) > 1.1 * smallest:
        warnings.append(f"data drives differ in size; {level} uses {_human_bytes(smallest)} of each")
    if backend == "mdadm":
        usable = {
            "raid0": smallest * len(members),
            "raid1": smallest,
            "raid10": smallest * len(members) // 2,
            "single": smallest,
        }[level]
    else:  # btrfs allocates per chunk, so unequal drives are used in full (roughly)
        usable = sum(sizes) if level in ("raid0", "single") else sum(sizes) // 2
    why_level = {
        "raid0": "RAID0 for rebuildable scratch: ~2x bandwidth and capacity, one failure loses it (mdadm(8))",
        "raid1": "RAID1: survives one drive failure, for data that cannot be rebuilt (mdadm(8))",
        "raid10": "RAID10: striped mirrors (mdadm(8))",
        "single": "single: no redundancy, no striping",
    }[level]
    layout = (
        f"mdadm {level}, chunk {MD_CHUNK_KB} KiB, XFS (mkfs.xfs reads md geometry), mount noatime,nofail (RHEL XFS docs)"
        if backend == "mdadm"
        else f"btrfs data {level}, metadata {'raid1' if len(members) > 1 else 'dup'}, mount noatime,nofail"
    )
    if backend == "mdadm" and level == "single":
        layout = "XFS directly on the drive, mount noatime,nofail (RHEL XFS docs)"
    if backend == "btrfs":
        proposal["metadata_profile"] = "raid1" if len(members) > 1 else "dup"
    what = "drive(s) from plan_storage_devices" if options.storage_devices else "unused NVMe drive(s)"
    proposal.update(
        proposed=True,
        devices=members,
        usable_bytes=usable,
        reason=(
            f"proposal only, not confirmed: {len(members)} {what} -> {options.data_mountpoint} "
            f"({_human_bytes(usable)}); {why_level}; {layout}"
        ),
    )
    return proposal


# --------------------------------------------------------------------------
# serving
# --------------------------------------------------------------------------


def serving_threads_per_worker(cores: int) -> int:
    """Threads per model-server worker for this many physical cores.  See docs/tuning.md, 'Serving'.

    One request is one small prediction: tree ensembles scale poorly past about 4 threads on
    one row or a small batch, and the HTTP layer of one Python process (its GIL) caps its own
    requests/s, so the cores are spent on workers first: 1 thread per worker up to 7 cores,
    2 from 8, 4 from 16."""
    if cores >= 16:
        return 4
    if cores >= 8:
        return 2
    return 1


def core_cpus(facts: Mapping[str, Any]) -> tuple[list[list[int]], str]:
    """The logical CPUs of each physical core, in core order, and where that came from.

    From the facts' ``cpu.core_cpus`` (sysfs sibling lists) when present; otherwise Linux's
    usual x86 numbering, where core k's SMT siblings are CPUs k, k + cores, k + 2 x cores."""
    cores = _need(facts, "cpu.cores")
    listed = _get(facts, "cpu.core_cpus")
    if isinstance(listed, list) and len(listed) == cores and all(isinstance(c, list) and c for c in listed):
        return [sorted(int(cpu) for cpu in core) for core in listed], "the sysfs sibling lists"
    threads = _get(facts, "cpu.threads", cores)
    smt = max(1, threads // cores)
    return [[k + i * cores for i in range(smt)] for k in range(cores)], "the usual numbering (no sibling lists in the facts)"


def plan_serving(facts: Mapping[str, Any], options: PlanOptions, settings: list[Setting], warnings: list[str]) -> dict[str, Any]:
    """Model-server workers, their CPU slices and the memory budget.  See docs/tuning.md, 'Serving'.

    workers x threads per worker = the physical cores (gunicorn issue 2873: N workers each
    starting N framework threads oversubscribe); each worker pinned to its own cores by
    CPUAffinity, since thread pools see the affinity mask but not a CPU quota (xgboost issue
    7653); the memory budget is a share of the RAM left after hugepages, split evenly, since
    every worker loads its own models after it starts (no fork after OpenMP: xgboost issue 8040)."""
    cores = _need(facts, "cpu.cores")
    slices, source = core_cpus(facts)
    reasons: list[str] = []
    if options.serving_threads_per_worker is not None:
        threads = options.serving_threads_per_worker
        threads_reason = f"{threads}: plan_serving_threads_per_worker"
    else:
        threads = min(serving_threads_per_worker(cores), cores)
        threads_reason = {
            1: "1 per worker below 8 cores: one row gains little from threads, a worker more adds requests/s",
            2: "2 per worker from 8 cores: batches gain from a second thread, workers still add requests/s",
            4: "4 per worker from 16 cores: tree models scale past 4 threads poorly on one row or a small batch",
        }[threads]
    if options.serving_workers is not None:
        workers = options.serving_workers
        workers_how = "plan_serving_workers"
    else:
        workers = max(1, cores // threads)
        workers_how = f"{cores} cores // {threads} thread(s) per worker"
    if workers * threads > cores:
        if not options.allow_oversubscription:
            raise PlanError(
                f"serving: {workers} workers x {threads} threads = {workers * threads} is more than the {cores} "
                "physical cores; lower plan_serving_workers or plan_serving_threads_per_worker, "
                "or set plan_allow_oversubscription: true"
            )
        warnings.append(f"serving: {workers} workers x {threads} threads on {cores} cores: oversubscribed by choice")
        worker_cpus = [sorted(c for core in slices for c in core) for _ in range(workers)]
        slice_reason = f"every worker on all {cores} cores: the slices would overlap (plan_allow_oversubscription)"
    else:
        worker_cpus = [sorted(c for core in slices[i * threads : (i + 1) * threads] for c in core) for i in range(workers)]
        idle = cores - workers * threads
        slice_reason = (
            f"each worker pinned (CPUAffinity) to its own {threads} core(s) and their SMT siblings, from {source}; "
            "thread pools see the affinity mask, not a CPU quota"
        )
        if idle:
            slice_reason += f"; {idle} core(s) left to the rest of the host"
    reasons.append(
        f"{workers}: {workers} worker(s) x {threads} thread(s) = {min(workers * threads, cores)} of {cores} cores "
        f"({workers_how}; N workers x N framework threads each would oversubscribe)"
    )
    reasons.append(threads_reason)
    reasons.append(slice_reason)

    total, reserved = _memory_and_hugepages(facts, settings, "the serving budget")
    budget = int((total - reserved) * options.serving_memory_share)
    per_worker = budget // workers
    cache = per_worker - SERVING_WORKER_OVERHEAD_BYTES
    after = f"{_gib(total)} RAM" + (f" - {_gib(reserved)} hugepages" if reserved else "")
    reasons.append(
        f"{budget}: {_gib(budget)} for the service, {options.serving_memory_share:g} of {after} "
        "(plan_serving_memory_share); "
        f"{_gib(per_worker)} per worker, each loading its own copy of the models"
    )
    if cache < 256 * 1024**2:
        raise PlanError(
            f"serving: {_gib(per_worker)} per worker leaves {_gib(max(cache, 0))} for models after the "
            f"{_gib(SERVING_WORKER_OVERHEAD_BYTES)} a worker needs itself; use fewer workers "
            "(plan_serving_workers) or a larger plan_serving_memory_share"
        )
    reasons.append(
        f"{_gib(cache)} model cache per worker: {_gib(per_worker)} - {_gib(SERVING_WORKER_OVERHEAD_BYTES)} "
        "for the worker itself; versions beyond it are evicted least recently used first"
    )
    return {
        "workers": workers,
        "threads_per_worker": threads,
        "worker_cpus": worker_cpus,
        "memory_budget_bytes": budget,
        "worker_memory_bytes": per_worker,
        "cache_budget_bytes": cache,
        "reasons": reasons,
    }


# --------------------------------------------------------------------------
# ray
# --------------------------------------------------------------------------


def plan_ray(facts: Mapping[str, Any], options: PlanOptions, settings: list[Setting], warnings: list[str]) -> list[Setting]:
    """A Ray node's CPUs, object store and task memory, and the CPUs of one trial.  See docs/ray.md, 'Sizing'.

    num_cpus is the physical cores: Ray counts logical CPUs by default, and a task's reservation
    becomes its OMP_NUM_THREADS, so SMT siblings would double the threads the BLAS and tree
    libraries start. The object store is a share of the RAM left after hugepages (Ray's own
    default is 30% of what is available; hugepages cannot back /dev/shm); the rest, less what the
    system and Ray's own processes keep, is the memory tasks may reserve."""
    cores = _need(facts, "cpu.cores")
    threads = _get(facts, "cpu.threads", cores)
    total, reserved = _memory_and_hugepages(facts, settings, "the Ray object store")
    after = total - reserved
    store = int(after * options.ray_object_store_share)
    after_text = f"{_gib(total)} RAM" + (f" - {_gib(reserved)} hugepages" if reserved else "")
    if store < RAY_MIN_OBJECT_STORE_BYTES:
        raise PlanError(
            f"ray: {options.ray_object_store_share:g} of {after_text} is {_human_bytes(store)}, below Ray's smallest "
            f"object store ({_human_bytes(RAY_MIN_OBJECT_STORE_BYTES)}); raise plan_ray_object_store_share or reserve fewer hugepages"
        )
    system = max(int(after * RAY_SYSTEM_SHARE), RAY_SYSTEM_MIN_BYTES)
    memory = after - store - system
    if memory < 512 * 1024**2:
        raise PlanError(
            f"ray: {after_text} leaves {_human_bytes(max(memory, 0))} for tasks after the "
            f"{_human_bytes(store)} object store and {_human_bytes(system)} for the system; "
            "lower plan_ray_object_store_share or reserve fewer hugepages"
        )
    smt = f", SMT siblings not counted ({threads} logical CPUs)" if threads > cores else ""
    return [
        Setting(
            "ray_num_cpus",
            cores,
            f"{cores}: the physical cores{smt}; Ray hands a task's reserved CPUs to it as OMP_NUM_THREADS "
            "(Ray resource docs; ray issue 28594)",
        ),
        Setting(
            "ray_object_store_bytes",
            store,
            f"{store}: {_gib(store)}, {options.ray_object_store_share:g} of {after_text} (plan_ray_object_store_share; "
            "Ray's default is 0.3 of the available memory); hugepages cannot back /dev/shm, and the role caps it "
            "at /dev/shm's size, since Ray falls back to a slow store on disk above it (ray PR 3149)",
        ),
        Setting(
            "ray_memory_bytes",
            memory,
            f"{memory}: {_gib(memory)} for tasks, {after_text} - {_gib(store)} object store - {_gib(system)} "
            f"for the system and Ray's own processes ({RAY_SYSTEM_SHARE:g} of it, at least {_gib(RAY_SYSTEM_MIN_BYTES)})",
        ),
        Setting(
            "ray_trial_cpus",
            1,
            "1: one CPU per distributed trial, so each trial runs one thread and a node runs one trial per core "
            "(the parallel-trials rule of 'Threads': small trials scale by processes, not threads)",
        ),
    ]


# --------------------------------------------------------------------------
# everything
# --------------------------------------------------------------------------

CONCERNS: tuple[Callable[[Mapping[str, Any], PlanOptions, list[str]], list[Setting]], ...] = (
    plan_threads,
    plan_runtime_threads,
    plan_dataloader,
    plan_thp,
    plan_hugepages,
    plan_cpufreq,
    plan_os,
    plan_runtimes,
)


def derive_plan(facts: Mapping[str, Any], options: PlanOptions | None = None) -> Plan:
    """Facts + options -> Plan.  Raises PlanError (one line) for bad input.
    The virtualization warning: docs/tuning.md, 'Virtualization'."""
    options = options if options is not None else PlanOptions()
    check_facts(facts)
    warnings: list[str] = []
    settings: list[Setting] = []
    for concern in CONCERNS:
        settings.extend(concern(facts, options, warnings))
    settings.append(plan_reboot(settings))
    settings.extend(plan_feature_matrix(facts, options, settings, warnings))
    settings.extend(plan_ray(facts, options, settings, warnings))
    storage = plan_storage(facts, options, warnings)
    serving = plan_serving(facts, options, settings, warnings)
    settings.extend(
        [
            Setting("serving_workers", serving["workers"], serving["reasons"][0]),
            Setting("serving_threads_per_worker", serving["threads_per_worker"], serving["reasons"][1]),
            Setting("serving_memory_budget_bytes", serving["memory_budget_bytes"], serving["reasons"][3]),
        ]
    )
    virt = _get(facts, "virtualization.type", "none")
    if virt not in (None, "none"):
        warnings.append(f"virtualized ({virt}): clocks, NUMA and drives belong to the host; figures may vary")
    return Plan(settings=settings, storage=storage, warnings=warnings, serving=serving)
