"""The ``plan_*`` variables as :class:`PlanOptions`: read from strings or YAML values, and
validated before any host is touched."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from provisioner.constants import (
    HUGEPAGES_SIZES,
    MAX_HUGEPAGES_SHARE,
    MAX_SERVING_MEMORY_SHARE,
    SERVING_ALLOCATORS,
    SERVING_MEMORY_SHARE,
    STORAGE_BACKENDS,
    STORAGE_LEVELS,
    SYSTEM_DIRECTORIES,
    THP_CHOICES,
    THP_DEFRAG_CHOICES,
    TUNED_PROFILES,
)
from provisioner.plan.base import PlanError

# Features of the float32 matrix the plan sizes when plan_feature_matrix_features is not given.
FEATURE_MATRIX_FEATURES = 200
# Ray (docs/ray.md, 'Sizing'): the object store's share of the RAM left after hugepages (Ray's own
# default is 30% of the available memory), and the most a share may be.
RAY_OBJECT_STORE_SHARE = 0.3
MAX_RAY_OBJECT_STORE_SHARE = 0.6


@dataclass(frozen=True)
class PlanOptions:
    """The ``plan_*`` variables, validated.  Field ``x`` is the variable ``plan_x``.

    The limits checked here (trials, hugepages share, data mount point) are explained in
    docs/tuning.md, 'Threads', 'Hugepages' and 'Data mount'.
    """

    trials: int | None = None
    allow_oversubscription: bool = False
    thp: str = "madvise"
    thp_defrag: str = "madvise"
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
    serving_allocator: str | None = None
    dataloader_workers: int | None = None
    polars_threads: int | None = None
    joblib_workers: int | None = None
    arrow_io_threads: int | None = None
    tf_inter_op_threads: int | None = None
    tuned: tuple[tuple[str, str], ...] = ()
    feature_matrix_features: int = FEATURE_MATRIX_FEATURES
    feature_matrix_rows: int | None = None
    ray_object_store_share: float = RAY_OBJECT_STORE_SHARE

    def __post_init__(self) -> None:
        if self.trials is not None and self.trials < 1:
            raise PlanError(f"plan_trials must be 1 or more (got {self.trials})")
        if self.dataloader_workers is not None and self.dataloader_workers < 0:
            raise PlanError(f"plan_dataloader_workers must be 0 or more (got {self.dataloader_workers})")
        for name in ("polars_threads", "joblib_workers", "arrow_io_threads", "tf_inter_op_threads"):
            count = getattr(self, name)
            if count is not None and count < 1:
                raise PlanError(f"plan_{name} must be 1 or more (got {count})")
        for key, evidence in self.tuned:
            if not key or not evidence:
                raise PlanError(f"plan_tuned must map a plan value to its evidence, neither empty (got {key!r}: {evidence!r})")
        if self.feature_matrix_features < 1:
            raise PlanError(f"plan_feature_matrix_features must be 1 or more (got {self.feature_matrix_features})")
        if self.feature_matrix_rows is not None and self.feature_matrix_rows < 1:
            raise PlanError(f"plan_feature_matrix_rows must be 1 or more (got {self.feature_matrix_rows})")
        if self.thp not in THP_CHOICES:
            raise PlanError(f"plan_thp must be one of {', '.join(THP_CHOICES)} (got {self.thp!r})")
        if self.thp_defrag not in THP_DEFRAG_CHOICES:
            raise PlanError(f"plan_thp_defrag must be one of {', '.join(THP_DEFRAG_CHOICES)} (got {self.thp_defrag!r})")
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
        if self.serving_allocator is not None and self.serving_allocator not in SERVING_ALLOCATORS:
            raise PlanError(
                f"plan_serving_allocator must be one of {', '.join(SERVING_ALLOCATORS)} (got {self.serving_allocator!r})"
            )
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

    @property
    def tuned_evidence(self) -> dict[str, str]:
        """plan_tuned as plan value -> evidence (written by `provisioner tune --write`)."""
        return dict(self.tuned)

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


def _as_tuned(key: str, value: Any) -> tuple[tuple[str, str], ...]:
    """A mapping plan value -> evidence (a JSON object as a string, as -e may give it), each
    evidence one line (whitespace runs, line breaks among them, become one space)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise PlanError(
                f"{key} must be a mapping of plan value to evidence, like {{threads_per_job: '...'}} (got {value!r})"
            ) from None
    if not isinstance(value, Mapping):
        raise PlanError(f"{key} must be a mapping of plan value to evidence, like {{threads_per_job: '...'}} (got {value!r})")
    out = []
    for name, evidence in value.items():
        if not isinstance(name, str) or not isinstance(evidence, str):
            raise PlanError(f"{key} must map plan value names to evidence strings (got {name!r}: {evidence!r})")
        out.append((name.strip(), " ".join(evidence.split())))
    return tuple(out)


_COERCE: dict[str, Callable[[str, Any], Any]] = {
    "trials": _as_int,
    "allow_oversubscription": _as_bool,
    "thp": lambda k, v: _as_str(k, v).lower(),
    "thp_defrag": lambda k, v: _as_str(k, v).lower(),
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
    "serving_allocator": lambda k, v: _as_str(k, v).lower(),
    "dataloader_workers": _as_int,
    "polars_threads": _as_int,
    "joblib_workers": _as_int,
    "arrow_io_threads": _as_int,
    "tf_inter_op_threads": _as_int,
    "tuned": _as_tuned,
    "feature_matrix_features": _as_int,
    "feature_matrix_rows": _as_int,
    "ray_object_store_share": _as_float,
}
