#!/usr/bin/env python3
"""provisioner's model server: one worker of the serving service, or a check of the registry.

  provisioner_serve.py --config /etc/provisioner/serving/serving.json --worker I
  provisioner_serve.py --config /etc/provisioner/serving/serving.json --check

It runs inside the ML environment (/opt/mlstack/bin/python). A worker takes its slice from
the config (CPUs, threads), loads and warms every listed model version itself (never before a
fork: a worker is a process of its own), then accepts on the serving socket (inherited from
systemd socket activation, or bound with SO_REUSEPORT) and on its own admin port, and tells
systemd READY=1. SIGTERM drains: the worker stops accepting, answers what arrives on its open
connections with `Connection: close` for a short period, then exits 0.

The registry is REGISTRY/NAME/VERSION/metadata.json next to the model file(s); it is trusted
input (root-owned, read-only to the service): scikit-learn models are joblib pickles.

The HTTP layer is starlette on uvicorn, the metrics prometheus-client; what is written here is
the product's own part: registry, model loading and sizing, the byte-budgeted LRU cache, input
validation, and the socket, readiness and drain handling around uvicorn.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import ctypes
import gc
import json
import os
import re
import signal
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

EXIT_BAD = 2
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
TASKS = ("regression", "classification")
# framework -> (the module it needs, the mlstack component that installs it)
FRAMEWORKS = {
    "xgboost": ("xgboost", "gbdt"),
    "lightgbm": ("lightgbm", "gbdt"),
    "catboost": ("catboost", "gbdt"),
    "sklearn": ("joblib", "core"),
    "torchscript": ("torch", "torch"),
}
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "BLIS_NUM_THREADS",
)
# Seconds a draining worker keeps answering (with Connection: close) on its open
# connections; it exits sooner once every serving connection is closed.
DRAIN_SECONDS = 3.0
BACKLOG = 2048
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
SD_LISTEN_FDS_START = 3
# A response sent before the request body was read (a 413 for its size, a 404 for its model)
# leaves the body in the socket; closing over unread data makes the kernel answer with a reset
# that can reach the client before the response does (RFC 9112, 9.6). So the rest of the body
# is read and thrown away first, as nginx's lingering close does for 30 s, up to this many
# bytes (or max_body_bytes, when larger) and this many seconds; beyond either the response goes
# at once with Connection: close.
DISCARD_BYTES = 64 << 20
DISCARD_SECONDS = 30.0
_NUMBERS = frozenset((int, float))


class BadInput(Exception):
    """A config or registry problem: one line naming it and the fix, exit 2."""


class ModelError(Exception):
    """A model version that cannot be loaded (the message names the file)."""


class RequestError(Exception):
    """A request the worker refuses with a 4xx; the worker keeps serving."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------------------
# Config


def _int(doc: dict[str, Any], key: str, where: str, minimum: int = 0, maximum: int | None = None) -> int:
    value = doc.get(key)
    if type(value) is not int or value < minimum or (maximum is not None and value > maximum):
        bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise BadInput(f"{where}: {key} must be an integer {bound}, not {value!r}; fix it in the serving role's options")
    return value


def json_object(path: str | Path, what: str, error: type[Exception], hint: str = "") -> dict[str, Any]:
    """The JSON object in PATH; a file that cannot be read, is not JSON or holds no object raises
    ERROR naming PATH and WHAT (HINT, where given, says what writes the file)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"{path}: cannot read the {what} ({exc.strerror}){hint}") from None
    except ValueError as exc:
        raise error(f"{path}: the {what} is not valid JSON ({exc}){hint}") from None
    if not isinstance(doc, dict):
        raise error(f"{path}: the {what} must be a JSON object{hint}")
    return doc


def load_config(path: str) -> dict[str, Any]:
    """Read and check serving.json; every problem is one line naming the key."""
    doc = json_object(path, "serving config", BadInput, "; the serving role writes it")
    if doc.get("schema") != 1:
        raise BadInput(
            f"{path}: schema {doc.get('schema')!r} is not 1, the one this server reads; update the server with the role"
        )
    for key in ("registry", "listen"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise BadInput(f"{path}: {key} must be a non-empty string")
    _int(doc, "port", path, 0, 65535)
    _int(doc, "admin_port_base", path, 1, 65535)
    _int(doc, "cache_budget_bytes", path, 1)
    _int(doc, "max_body_bytes", path, 1)
    _int(doc, "max_batch_rows", path, 1)
    _int(doc, "warmup_requests", path, 0)
    workers = doc.get("workers")
    if not isinstance(workers, list) or not workers:
        raise BadInput(f"{path}: workers must be a non-empty list of {{index, cpus, threads}}")
    for position, worker in enumerate(workers):
        where = f"{path}: workers[{position}]"
        if not isinstance(worker, dict):
            raise BadInput(f"{where} must be an object {{index, cpus, threads}}")
        if _int(worker, "index", where, 0) != position:
            raise BadInput(f"{where}: index {worker['index']} must equal its position {position}")
        _int(worker, "threads", where, 1)
        cpus = worker.get("cpus")
        if not isinstance(cpus, list) or not cpus or not all(type(c) is int and c >= 0 for c in cpus):
            raise BadInput(f"{where}: cpus must be a non-empty list of CPU numbers, not {cpus!r}")
        if _int(doc, "admin_port_base", path) + position > 65535:
            raise BadInput(f"{path}: admin_port_base + {position} is above 65535")
    models = doc.get("models")
    if models != "all":
        if not isinstance(models, list):
            raise BadInput(f'{path}: models must be "all" or a list of {{name, version}}, not {models!r}')
        for entry in models:
            if not isinstance(entry, dict) or not all(
                isinstance(entry.get(k), str) and NAME_RE.match(entry[k]) for k in ("name", "version")
            ):
                raise BadInput(f"{path}: models entry {entry!r} needs a name and a version of [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    return doc


# ---------------------------------------------------------------------------------------
# Registry


class Metadata:
    __slots__ = ("dir", "features", "file", "framework", "name", "task", "version")

    def __init__(self, name: str, version: str, directory: Path, doc: dict[str, Any]) -> None:
        self.name = name
        self.version = version
        self.dir = directory
        self.framework: str = doc["framework"]
        self.file: Path = directory / doc["file"]
        self.features: list[str] = doc["features"]
        self.task: str = doc.get("task", "regression")


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (0, version)


class Registry:
    """REGISTRY/NAME/VERSION/metadata.json, read from disk on every question (it is the truth)."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def versions(self, name: str) -> list[str]:
        """The versions of NAME present (with a metadata.json), lowest first."""
        if not NAME_RE.match(name):
            return []
        try:
            entries = os.listdir(self.root / name)
        except OSError:
            return []
        found = [v for v in entries if NAME_RE.match(v) and os.path.isfile(self.root / name / v / "metadata.json")]
        if all(v.isdigit() for v in found):
            return sorted(found, key=int)
        return sorted(found)

    def latest(self, name: str) -> str | None:
        found = self.versions(name)
        return found[-1] if found else None

    def names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.root) if NAME_RE.match(n) and os.path.isdir(self.root / n))
        except OSError:
            return []

    def all_versions(self) -> list[tuple[str, str]]:
        return [(name, version) for name in self.names() for version in self.versions(name)]

    def has(self, name: str, version: str) -> bool:
        return bool(NAME_RE.match(name) and NAME_RE.match(version)) and os.path.isfile(
            self.root / name / version / "metadata.json"
        )

    def metadata(self, name: str, version: str) -> Metadata:
        directory = self.root / name / version
        path = directory / "metadata.json"
        doc = json_object(path, "model metadata", ModelError)
        framework = doc.get("framework")
        if framework not in FRAMEWORKS:
            raise ModelError(f"{path}: framework {framework!r} is not one of {', '.join(FRAMEWORKS)}")
        file = doc.get("file")
        if not isinstance(file, str) or not file or os.path.isabs(file) or ".." in Path(file).parts:
            raise ModelError(f"{path}: file must name the model file relative to {directory}, not {file!r}")
        features = doc.get("features")
        if (
            not isinstance(features, list)
            or not features
            or not all(isinstance(f, str) and f for f in features)
            or len(set(features)) != len(features)
        ):
            raise ModelError(f"{path}: features must be a non-empty list of distinct feature names")
        if doc.get("task", "regression") not in TASKS:
            raise ModelError(f"{path}: task {doc.get('task')!r} is not one of {', '.join(TASKS)}")
        return Metadata(name, version, directory, doc)


def files_bytes(directory: Path) -> int:
    """The size on disk of every file of a version."""
    total = 0
    for base, _dirs, files in os.walk(directory):
        for file in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(base, file)).st_size
    return total


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def settle_heap() -> None:
    """After loading: move what is loaded out of the garbage collector's sight.

    A full collection walks every object of the frameworks and models (milliseconds, in
    the middle of some request); frozen objects are not walked. Requests make few cycles.
    """
    gc.collect()
    gc.freeze()


def release_memory() -> None:
    """Give freed model memory back to the system (glibc keeps it otherwise)."""
    gc.unfreeze()  # an evicted model's cycles, if any, are collectable again
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


# ---------------------------------------------------------------------------------------
# Models


Predict = Callable[[Any], Any]


def _load_xgboost(meta: Metadata, threads: int) -> tuple[Predict, int | None]:
    import xgboost

    booster = xgboost.Booster(model_file=str(meta.file))
    booster.set_param({"nthread": threads})

    def predict(x: Any) -> Any:
        return booster.inplace_predict(x, validate_features=False)

    fast = _xgboost_dense_predict(booster)
    if fast is not None:
        import numpy

        probe = numpy.linspace(-1.0, 1.0, 2 * booster.num_features(), dtype=numpy.float32).reshape(2, -1)
        if numpy.array_equal(fast(probe), predict(probe)):
            return fast, booster.num_features()
    return predict, booster.num_features()


def _xgboost_dense_predict(booster: Any) -> Predict | None:
    """inplace_predict through XGBoost's C API with one proxy DMatrix kept per model.

    The Python inplace_predict makes a new proxy on every call, and each proxy reads the
    cgroup CPU quota files (a Context per proxy): about half of a single-row predict.
    Returns None where this XGBoost lacks the pieces (then inplace_predict is used).
    """
    try:
        import numpy
        from xgboost import core

        lib, check, proxy = core._LIB, core._check_call, core._ProxyDMatrix()
        call = lib.XGBoosterPredictFromDense
    except (ImportError, AttributeError):
        return None
    handle = booster.handle
    args = json.dumps(
        {
            "type": 0,
            "training": False,
            "iteration_begin": 0,
            "iteration_end": 0,
            "missing": float("nan"),
            "strict_shape": False,
            "cache_id": 0,
        }
    ).encode()
    c_uint64, c_float, byref, pointer = ctypes.c_uint64, ctypes.c_float, ctypes.byref, ctypes.POINTER
    as_array, dumps = numpy.ctypeslib.as_array, json.dumps

    def predict(x: Any) -> Any:
        iface = dumps({"data": (x.ctypes.data, True), "shape": x.shape, "strides": None, "typestr": "<f4", "version": 3})
        shape, dims, out = pointer(c_uint64)(), c_uint64(), pointer(c_float)()
        check(call(handle, iface.encode(), args, proxy.handle, byref(shape), byref(dims), byref(out)))
        dims_shape = tuple(shape[i] for i in range(dims.value))
        size = 1
        for d in dims_shape:
            size *= d
        result = as_array(out, (size,)).copy()  # the buffer belongs to the booster: copy before the next call
        return result.reshape(dims_shape) if len(dims_shape) > 1 else result

    predict.keep = (proxy, booster)  # type: ignore[attr-defined]
    return predict


def _load_lightgbm(meta: Metadata, threads: int) -> tuple[Predict, int | None]:
    import lightgbm

    booster = lightgbm.Booster(model_file=str(meta.file))

    def predict(x: Any) -> Any:
        return booster.predict(x, num_threads=threads)

    return predict, booster.num_feature()


def _load_catboost(meta: Metadata, threads: int) -> tuple[Predict, int | None]:
    import catboost

    model = catboost.CatBoost()
    model.load_model(str(meta.file), format="cbm")
    kind = "Probability" if meta.task == "classification" else "RawFormulaVal"

    def predict(x: Any) -> Any:
        return model.predict(x, prediction_type=kind, thread_count=threads)

    names = model.feature_names_
    return predict, len(names) if names is not None else None


def _load_sklearn(meta: Metadata, threads: int) -> tuple[Predict, int | None]:
    import joblib

    estimator = joblib.load(meta.file)
    # An estimator saved with n_jobs=-1 would start a pool of every CPU per predict: the slice's threads.
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        jobs = {key: threads for key in estimator.get_params(deep=True) if key == "n_jobs" or key.endswith("__n_jobs")}
        if jobs:
            estimator.set_params(**jobs)
    if meta.task == "classification":
        if not hasattr(estimator, "predict_proba"):
            raise ModelError(
                f"{meta.file}: task classification needs an estimator with predict_proba, {type(estimator).__name__} has none"
            )
        call = estimator.predict_proba
    elif hasattr(estimator, "predict"):
        call = estimator.predict
    else:
        raise ModelError(f"{meta.file}: {type(estimator).__name__} is not a scikit-learn estimator (no predict)")
    # A model fitted on a DataFrame warns on every numpy row; the names are checked here instead.
    warnings.filterwarnings("ignore", message="X does not have valid feature names")
    n = getattr(estimator, "n_features_in_", None)
    return call, int(n) if n is not None else None


def _load_torchscript(meta: Metadata, threads: int) -> tuple[Predict, int | None]:
    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # set once per process; a second model finds it set
        torch.set_num_interop_threads(1)
    module = torch.jit.load(str(meta.file), map_location="cpu")
    module.eval()

    def predict(x: Any) -> Any:
        with torch.inference_mode():
            out = module(torch.from_numpy(x))
        if not isinstance(out, torch.Tensor):
            raise ValueError(f"the module returned {type(out).__name__}, not a tensor")
        return out.float().numpy()

    return predict, None


LOADERS: dict[str, Callable[[Metadata, int], tuple[Predict, int | None]]] = {
    "xgboost": _load_xgboost,
    "lightgbm": _load_lightgbm,
    "catboost": _load_catboost,
    "sklearn": _load_sklearn,
    "torchscript": _load_torchscript,
}


class Model:
    """One loaded version: its feature order, its predict function and its bytes."""

    __slots__ = ("bytes", "features", "framework", "index", "n", "name", "np", "predict_fn", "task", "version")

    def __init__(self, meta: Metadata, predict_fn: Predict, size: int) -> None:
        import numpy

        self.np = numpy
        self.name = meta.name
        self.version = meta.version
        self.framework = meta.framework
        self.task = meta.task
        self.features = meta.features
        self.index = {f: i for i, f in enumerate(meta.features)}
        self.n = len(meta.features)
        self.predict_fn = predict_fn
        self.bytes = size

    def predict(self, rows: Any) -> list[Any]:
        """Rows (a float32 array, n columns) -> one float, or a list of floats, per row."""
        out = self.np.asarray(self.predict_fn(rows))
        if out.ndim == 2 and out.shape[1] == 1:
            out = out[:, 0]
        elif out.ndim == 2 and out.shape[1] == 2 and self.task == "classification":
            out = out[:, 1]  # binary: the positive class's probability
        if out.ndim not in (1, 2) or out.shape[0] != rows.shape[0]:
            raise ValueError(f"the model returned shape {out.shape} for {rows.shape[0]} rows")
        if out.dtype.kind != "f":
            out = out.astype(self.np.float64)
        return out.tolist()

    def values(self, mapping: dict[str, Any], where: str = "") -> list[Any]:
        """One row by feature name, in the model's order; 422 naming what is wrong."""
        names = self.features
        values = None
        if len(mapping) == self.n:
            try:
                values = [mapping[f] for f in names]
            except KeyError:
                values = None
        if values is None:
            missing = [f for f in names if f not in mapping]
            extra = [k for k in mapping if k not in self.index]
            parts = []
            if missing:
                parts.append("missing features: " + _some(missing))
            if extra:
                parts.append("extra features: " + _some(extra))
            raise RequestError(422, f"{where}{'; '.join(parts)} ({self.name}/{self.version} takes {self.n} features by name)")
        if not _NUMBERS.issuperset(map(type, values)):
            bad = [f"{f}={mapping[f]!r}" for f in names if type(mapping[f]) not in _NUMBERS]
            raise RequestError(422, f"{where}non-numeric features: {_some(bad)} (numbers only)")
        return values

    def array(self, rows: list[list[Any]]) -> Any:
        try:
            return self.np.array(rows, dtype=self.np.float32)
        except (OverflowError, ValueError) as exc:
            raise RequestError(422, f"features out of range for float32: {exc}") from None

    def warm(self, requests: int) -> None:
        zero = self.np.zeros((1, self.n), dtype=self.np.float32)
        for _ in range(requests):
            self.predict(zero)


def _some(items: list[str], limit: int = 10) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def load_model(registry: Registry, name: str, version: str, threads: int) -> Model:
    """Load one version and predict one zero row; ModelError names the file on any failure."""
    meta = registry.metadata(name, version)
    module, component = FRAMEWORKS[meta.framework]
    try:
        __import__(module)
    except ImportError:
        raise ModelError(
            f"{meta.dir / 'metadata.json'}: framework {meta.framework} needs the Python package {module}, "
            f"missing from the ML environment; add the mlstack component {component} (mlstack_components)"
        ) from None
    if not meta.file.is_file():
        raise ModelError(f"{meta.file}: the model file is missing (metadata.json names it)")
    before = rss_bytes()
    try:
        predict_fn, n = LOADERS[meta.framework](meta, threads)
    except ModelError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{meta.file}: corrupt or unreadable {meta.framework} model ({first[:300]})") from None
    if n is not None and n != len(meta.features):
        raise ModelError(f"{meta.file}: the model takes {n} features but metadata.json lists {len(meta.features)}")
    model = Model(meta, predict_fn, 0)
    try:
        model.warm(1)
    except Exception as exc:
        raise ModelError(f"{meta.file}: predicting a zero row of {model.n} features fails ({str(exc).strip()[:300]})") from None
    model.bytes = max(rss_bytes() - before, files_bytes(meta.dir))
    return model


def listed_versions(config: dict[str, Any], registry: Registry) -> list[tuple[str, str]]:
    if config["models"] == "all":
        return registry.all_versions()
    return [(m["name"], m["version"]) for m in config["models"]]


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def over_budget_message(models: list[Model], budget: int) -> str:
    total = sum(m.bytes for m in models)
    parts = ", ".join(f"{m.name}/{m.version} {_size(m.bytes)}" for m in sorted(models, key=lambda m: -m.bytes))
    return (
        f"the listed model versions take {_size(total)} ({total} bytes: {parts}), more than the per-worker "
        f"cache budget of {_size(budget)} ({budget} bytes); list fewer versions or give serving more memory"
    )


@contextlib.contextmanager
def quiet_output() -> Iterator[None]:
    """Keep the frameworks' native messages (LightGBM's [Fatal] lines...) off stdout and stderr."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def check(config: dict[str, Any]) -> int:
    """--check: load every listed version once here, compare the total with the budget."""
    registry = Registry(config["registry"])
    if not os.path.isdir(registry.root):
        raise BadInput(f"registry {registry.root} is not a directory; create it or fix serving registry")
    models = []
    for name, version in listed_versions(config, registry):
        if not registry.has(name, version):
            raise BadInput(
                f"listed version {name}/{version} is not in the registry ({registry.root / name / version}/metadata.json missing)"
            )
        try:
            with quiet_output():
                models.append(load_model(registry, name, version, 1))
        except ModelError as exc:
            raise BadInput(str(exc)) from None
    total = sum(m.bytes for m in models)
    if total > config["cache_budget_bytes"]:
        raise BadInput(over_budget_message(models, config["cache_budget_bytes"]))
    print(
        json.dumps({"models": [{"name": m.name, "version": m.version, "bytes": m.bytes} for m in models], "total_bytes": total})
    )
    return 0


# ---------------------------------------------------------------------------------------
# Worker state: cache and metrics


class Metrics:
    def __init__(self, worker: int, budget: int) -> None:
        import prometheus_client as prom

        with contextlib.suppress(AttributeError):
            prom.disable_created_metrics()
        self.prom = prom
        self.registry = prom.CollectorRegistry(auto_describe=True)
        w = str(worker)
        reg = self.registry
        self._requests = prom.Counter(
            "provisioner_serving_requests_total",
            "Predict requests by model, version and status code.",
            ["worker", "model", "version", "code"],
            registry=reg,
        )
        self._duration = prom.Histogram(
            "provisioner_serving_request_duration_seconds",
            "Predict request duration, body read to response built.",
            ["worker", "model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.loaded = prom.Gauge(
            "provisioner_serving_loaded_versions", "Model versions in the cache.", ["worker"], registry=reg
        ).labels(w)
        self.cache = prom.Gauge(
            "provisioner_serving_cache_bytes", "Bytes of the model versions in the cache.", ["worker"], registry=reg
        ).labels(w)
        budget_gauge = prom.Gauge("provisioner_serving_cache_budget_bytes", "The cache's byte budget.", ["worker"], registry=reg)
        budget_gauge.labels(w).set(budget)
        self.evictions = prom.Counter(
            "provisioner_serving_cache_evictions_total",
            "Versions evicted from the cache (least recently used).",
            ["worker"],
            registry=reg,
        ).labels(w)
        self._loads = prom.Counter(
            "provisioner_serving_model_loads_total", "Model version loads by result.", ["worker", "result"], registry=reg
        )
        self.loads_ok = self._loads.labels(w, "ok")
        self.loads_error = self._loads.labels(w, "error")
        self.worker = w
        self._request_children: dict[tuple[str, str, int], Any] = {}
        self._duration_children: dict[tuple[str, str], Any] = {}

    def request(self, model: str, version: str, code: int, seconds: float | None) -> None:
        key = (model, version, code)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self._requests.labels(self.worker, model, version, str(code))
        child.inc()
        if seconds is not None:
            hkey = (model, version)
            hist = self._duration_children.get(hkey)
            if hist is None:
                hist = self._duration_children[hkey] = self._duration.labels(self.worker, model, version)
            hist.observe(seconds)

    def text(self) -> bytes:
        return self.prom.generate_latest(self.registry)


class Cache:
    """Loaded versions in least-recently-used order, within a byte budget."""

    def __init__(self, budget: int, metrics: Metrics) -> None:
        self.budget = budget
        self.metrics = metrics
        self.entries: collections.OrderedDict[tuple[str, str], Model] = collections.OrderedDict()
        self.bytes = 0

    def get(self, key: tuple[str, str]) -> Model | None:
        model = self.entries.get(key)
        if model is not None:
            self.entries.move_to_end(key)
        return model

    def put(self, model: Model, evict: bool = True) -> list[Model]:
        """Add a version; evict the least recently used others while over budget (never itself)."""
        key = (model.name, model.version)
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= old.bytes
        self.entries[key] = model
        self.bytes += model.bytes
        evicted = []
        while evict and self.bytes > self.budget and len(self.entries) > 1:
            _key, victim = self.entries.popitem(last=False)
            self.bytes -= victim.bytes
            evicted.append(victim)
        if evicted:
            self.metrics.evictions.inc(len(evicted))
        self.metrics.loaded.set(len(self.entries))
        self.metrics.cache.set(self.bytes)
        return evicted


class Worker:
    def __init__(self, config: dict[str, Any], index: int, config_path: str) -> None:
        self.config = config
        self.index = index
        self.config_path = config_path
        spec = config["workers"][index]
        self.threads: int = spec["threads"]
        self.registry = Registry(config["registry"])
        self.max_body: int = config["max_body_bytes"]
        self.max_rows: int = config["max_batch_rows"]
        self.metrics = Metrics(index, config["cache_budget_bytes"])
        self.cache = Cache(config["cache_budget_bytes"], self.metrics)
        self.listed: set[tuple[str, str]] = set()
        self.ready = False
        self.draining = False
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._close_headers = {"connection": "close"}
        import numpy

        self.np = numpy

    # -- loading

    def load_listed(self) -> list[Model]:
        """Load every listed version (in a thread, before the worker is ready)."""
        wanted = listed_versions(self.config, self.registry)
        for name, version in wanted:
            if not self.registry.has(name, version):
                raise BadInput(
                    f"listed version {name}/{version} is not in the registry "
                    f"({self.registry.root / name / version}/metadata.json missing)"
                )
        models = []
        for name, version in wanted:
            try:
                models.append(load_model(self.registry, name, version, self.threads))
            except ModelError as exc:
                self.metrics.loads_error.inc()
                raise BadInput(str(exc)) from None
            self.metrics.loads_ok.inc()
        self.listed = set(wanted)
        return models

    def start_models(self, models: list[Model]) -> None:
        """Warm the loaded versions on the serving thread and put them in the cache."""
        for model in models:
            model.warm(self.config["warmup_requests"])
            self.cache.put(model, evict=False)
        if self.cache.bytes > self.cache.budget:
            log(f"worker {self.index}: warning: {over_budget_message(models, self.cache.budget)}")
        settle_heap()

    async def resolve(self, name: str, version: str) -> Model:
        if version == "latest":
            found = self.registry.latest(name)
            if found is None:
                raise RequestError(404, f"no model {name!r} in the registry")
            version = found
        key = (name, version)
        model = self.cache.get(key)
        if model is not None:
            return model
        if not self.registry.has(name, version):
            raise RequestError(404, f"no model version {name}/{version} in the registry")
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            model = self.cache.get(key)
            if model is not None:
                return model
            try:
                model = await asyncio.to_thread(load_model, self.registry, name, version, self.threads)
                model.warm(self.config["warmup_requests"])
            except ModelError as exc:
                self.metrics.loads_error.inc()
                log(f"worker {self.index}: {exc}")
                raise RequestError(500, f"model version {name}/{version} cannot be loaded: {exc}") from None
            self.metrics.loads_ok.inc()
            evicted = self.cache.put(model)
            if evicted:
                log(
                    f"worker {self.index}: evicted {', '.join(f'{m.name}/{m.version}' for m in evicted)} to load {name}/{version}"
                )
                del evicted
                release_memory()
            settle_heap()
        self._locks.pop(key, None)
        return model

    # -- HTTP

    def response(self, status: int, doc: Any) -> Any:
        from starlette.responses import Response

        return Response(
            json.dumps(doc, separators=(",", ":")),
            status,
            headers=self._close_headers if self.draining else None,
            media_type="application/json",
        )

    async def body(self, request: Any) -> bytes:
        length = request.headers.get("content-length")
        if length is not None:
            try:
                size = int(length)
            except ValueError:
                raise RequestError(400, f"Content-Length {length!r} is not a number") from None
            if size > self.max_body:
                raise RequestError(413, f"body of {size} bytes is above max_body_bytes {self.max_body}")
            return await request.body()
        chunks = []
        total = 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > self.max_body:
                raise RequestError(413, f"body above max_body_bytes {self.max_body}")
            chunks.append(chunk)
        return b"".join(chunks)

    async def document(self, request: Any) -> Any:
        raw = await self.body(request)
        try:
            return json.loads(raw, parse_constant=_no_constant)
        except ValueError as exc:
            raise RequestError(400, f"malformed JSON body: {exc}") from None

    async def predict(self, request: Any) -> Any:
        return await self._predict(request, batch=False)

    async def predict_batch(self, request: Any) -> Any:
        return await self._predict(request, batch=True)

    async def _predict(self, request: Any, batch: bool) -> Any:
        start = time.perf_counter()
        params = request.path_params
        name, version = params["name"], params["version"]
        label_model = label_version = ""
        try:
            model = await self.resolve(name, version)
            label_model, label_version = model.name, model.version
            doc = await self.document(request)
            if batch:
                rows = self.batch_rows(model, doc)
                result = {"model": model.name, "version": model.version, "predictions": model.predict(model.array(rows))}
            else:
                features = doc.get("features") if type(doc) is dict else None
                if type(features) is not dict or len(doc) != 1:
                    raise RequestError(422, 'the body must be {"features": {"name": number, ...}}')
                row = model.values(features)
                result = {"model": model.name, "version": model.version, "prediction": model.predict(model.array([row]))[0]}
            code = 200
        except RequestError as exc:
            code = exc.status
            result = {"error": str(exc)}
        except Exception as exc:  # a framework error on this input: the worker keeps serving
            code = 500
            result = {"error": f"prediction failed: {type(exc).__name__}: {str(exc).strip()[:300]}"}
        response = self.response(code, result)
        self.metrics.request(label_model, label_version, code, time.perf_counter() - start if label_model else None)
        return response

    def batch_rows(self, model: Model, doc: Any) -> list[list[Any]]:
        rows = doc.get("rows") if type(doc) is dict else None
        if type(rows) is not list or len(doc) != 1:
            raise RequestError(
                422, 'the body must be {"rows": [[numbers in feature order], ...]} or {"rows": [{"name": number}, ...]}'
            )
        if not rows:
            raise RequestError(422, "rows is empty")
        if len(rows) > self.max_rows:
            raise RequestError(413, f"{len(rows)} rows are above max_batch_rows {self.max_rows}")
        first = type(rows[0])
        if first is dict:
            out = []
            for i, row in enumerate(rows):
                if type(row) is not dict:
                    raise RequestError(422, f"row {i}: every row must be an object like row 0")
                out.append(model.values(row, f"row {i}: "))
            return out
        if first is not list:
            raise RequestError(422, "rows must be lists of numbers in feature order or objects by feature name")
        n = model.n
        for i, row in enumerate(rows):
            if type(row) is not list or len(row) != n:
                got = f"{len(row)} values" if type(row) is list else type(row).__name__
                raise RequestError(
                    422,
                    f"row {i}: {got}, but {model.name}/{model.version} takes {n} features in order: {_some(model.features, 5)}",
                )
            if not _NUMBERS.issuperset(map(type, row)):
                bad = [f"{model.features[j]}={v!r}" for j, v in enumerate(row) if type(v) not in _NUMBERS]
                raise RequestError(422, f"row {i}: non-numeric features: {_some(bad)} (numbers only)")
        return rows

    async def healthz(self, request: Any) -> Any:
        return self.response(200, {"status": "ok", "worker": self.index})

    async def readyz(self, request: Any) -> Any:
        if self.ready and not self.draining:
            return self.response(200, {"status": "ready", "worker": self.index})
        return self.response(503, {"status": "draining" if self.draining else "loading", "worker": self.index})

    async def models(self, request: Any) -> Any:
        return self.response(200, self.models_doc())

    def models_doc(self) -> dict[str, Any]:
        entries = []
        seen = set()
        for name, version in self.registry.all_versions():
            seen.add((name, version))
            loaded = self.cache.entries.get((name, version))
            entry: dict[str, Any] = {"name": name, "version": version}
            if loaded is not None:
                entry.update(framework=loaded.framework, features=loaded.n, loaded=True, bytes=loaded.bytes)
            else:
                try:
                    meta = self.registry.metadata(name, version)
                    entry.update(framework=meta.framework, features=len(meta.features))
                except ModelError as exc:
                    entry.update(framework=None, features=0, error=str(exc))
                entry.update(loaded=False, bytes=files_bytes(self.registry.root / name / version))
            entry["listed"] = (name, version) in self.listed
            entries.append(entry)
        for (name, version), loaded in self.cache.entries.items():
            if (name, version) not in seen:  # removed from disk, still served from the cache
                entries.append(
                    {
                        "name": name,
                        "version": version,
                        "framework": loaded.framework,
                        "features": loaded.n,
                        "loaded": True,
                        "bytes": loaded.bytes,
                        "listed": (name, version) in self.listed,
                    }
                )
        return {
            "worker": self.index,
            "threads": self.threads,
            "cpus": sorted(os.sched_getaffinity(0)),
            "cache_budget_bytes": self.cache.budget,
            "cache_bytes": self.cache.bytes,
            "models": entries,
        }

    async def metrics_endpoint(self, request: Any) -> Any:
        from starlette.responses import Response

        return Response(
            self.metrics.text(),
            200,
            headers=self._close_headers if self.draining else None,
            media_type=self.metrics.prom.CONTENT_TYPE_LATEST,
        )

    async def not_found(self, request: Any, exc: Any) -> Any:
        status = getattr(exc, "status_code", 404)
        return self.response(status, {"error": f"{request.method} {request.url.path}: {getattr(exc, 'detail', 'not found')}"})

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        app = Starlette(
            routes=[
                Route("/v1/models/{name}/{version}/predict", self.predict, methods=["POST"]),
                Route("/v1/models/{name}/{version}/predict/batch", self.predict_batch, methods=["POST"]),
                Route("/healthz", self.healthz, methods=["GET"]),
                Route("/readyz", self.readyz, methods=["GET"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/metrics", self.metrics_endpoint, methods=["GET"]),
            ],
            exception_handlers={404: self.not_found, 405: self.not_found},
        )
        return DiscardUnreadBody(app, max(DISCARD_BYTES, self.max_body))


class DiscardUnreadBody:
    """ASGI middleware: before a response starts, the request body the app left unread is read
    and thrown away (up to `limit` bytes and DISCARD_SECONDS), so a client that sends its whole
    body before reading (no `Expect: 100-continue`: urllib, requests) gets the response instead
    of a connection reset. A client that asked for 100 Continue and was not told to send gets
    the response at once with `Connection: close`, as does a body larger than the limit."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[Any], Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        try:
            declared = int(length) if length is not None else None
        except ValueError:
            declared = None
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        state = {
            "unread": chunked or bool(declared),  # a body the app has not read to its end
            "asked": False,  # the app called receive (so the server sent 100 Continue, if asked for)
        }
        expects = headers.get(b"expect", b"").lower() == b"100-continue"

        async def tracked_receive() -> Any:
            state["asked"] = True
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                state["unread"] = False
            return message

        async def discarding_send(message: Any) -> None:
            if message["type"] == "http.response.start" and state["unread"]:
                state["unread"] = False
                if not await self.discard(receive, declared, expects and not state["asked"]):
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        await self.app(scope, tracked_receive, discarding_send)

    async def discard(self, receive: Callable[[], Any], declared: int | None, not_sent: bool) -> bool:
        """True when the rest of the body was read (the connection stays usable)."""
        if not_sent or (declared is not None and declared > self.limit):
            return False
        read = 0
        try:
            async with asyncio.timeout(DISCARD_SECONDS):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        return False  # the client went away
                    read += len(message.get("body", b""))
                    if not message.get("more_body", False):
                        return True
                    if read > self.limit:
                        return False
        except TimeoutError:
            return False


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


# ---------------------------------------------------------------------------------------
# Process set-up: threads, CPUs, sockets, systemd


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def set_threads(threads: int) -> None:
    for var in THREAD_VARS:
        os.environ[var] = str(threads)


def set_affinity(cpus: list[int]) -> None:
    wanted = set(cpus)
    current = os.sched_getaffinity(0)
    if current <= wanted:
        return  # already inside the slice (the unit's CPUAffinity=)
    try:
        os.sched_setaffinity(0, wanted)
    except OSError as exc:
        raise BadInput(
            f"cannot pin this worker to CPUs {sorted(wanted)} ({exc.strerror}); this process may use {sorted(current)}: fix the workers' cpus"
        ) from None


def inherited_socket() -> socket.socket | None:
    """The serving socket systemd passed (socket activation), or None."""
    count = os.environ.get("LISTEN_FDS")
    pid = os.environ.get("LISTEN_PID")
    if not count or (pid and pid.isdigit() and int(pid) != os.getpid()):
        return None
    for var in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
        os.environ.pop(var, None)
    if not count.isdigit() or int(count) < 1:
        return None
    sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    if sock.type != socket.SOCK_STREAM or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        raise BadInput("the socket systemd passed (fd 3) is not a listening stream socket; check provisioner-serve.socket")
    sock.set_inheritable(False)
    sock.setblocking(False)
    return sock


def bind(host: str, port: int, reuseport: bool, what: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuseport:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        hint = (
            " (a process that does not share it with SO_REUSEPORT holds it)"
            if reuseport
            else " (is this worker already running?)"
        )
        raise BadInput(
            f"cannot listen on {host}:{port} for the {what}: {exc.strerror}{hint if exc.errno == 98 else ''}"
        ) from None
    sock.setblocking(False)
    return sock


def sd_notify(message: str) -> None:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        log(f"cannot notify systemd at {address!r}: {exc.strerror}")


def _uvicorn_server(app: Any) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn without its own signal handling: the worker drains itself."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    config = uvicorn.Config(
        app,
        lifespan="off",
        access_log=False,
        log_level="warning",
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=int(DRAIN_SECONDS) + 2,
        backlog=BACKLOG,
    )
    return Server(config)


async def run_worker(config: dict[str, Any], index: int, config_path: str) -> int:
    worker = Worker(config, index, config_path)
    app = worker.app()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal() -> None:
        if not worker.ready:
            log(f"worker {index}: stopped while loading")
            os._exit(0)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)

    serving_sock = inherited_socket()
    admin_port = config["admin_port_base"] + index
    admin_sock = bind("127.0.0.1", admin_port, False, f"admin port of worker {index}")
    admin = _uvicorn_server(app)
    admin_task = asyncio.create_task(admin.serve(sockets=[admin_sock]))

    models = await asyncio.to_thread(worker.load_listed)
    worker.start_models(models)
    del models
    if serving_sock is None:
        serving_sock = bind(config["listen"], config["port"], True, "serving socket")
    host, port = serving_sock.getsockname()[:2]
    where = f"{host}:{port}"
    serving = _uvicorn_server(app)
    serving_task = asyncio.create_task(serving.serve(sockets=[serving_sock]))
    while not serving.started:
        if serving_task.done() or admin_task.done():
            log(f"worker {index}: the HTTP server did not start")
            return 1
        await asyncio.sleep(0.005)
    worker.ready = True
    sd_notify(f"READY=1\nSTATUS=serving {len(worker.cache.entries)} model versions")
    log(
        f"worker {index}: ready: {len(worker.cache.entries)} versions ({_size(worker.cache.bytes)} of {_size(worker.cache.budget)}), "
        f"{worker.threads} threads on CPUs {sorted(os.sched_getaffinity(0))}, serving {where}, admin 127.0.0.1:{admin_port}"
    )
    stop_wait = asyncio.create_task(stop.wait())
    await asyncio.wait([stop_wait, serving_task, admin_task], return_when=asyncio.FIRST_COMPLETED)
    if not stop.is_set():
        log(f"worker {index}: the HTTP server stopped")
        return 1

    # Drain: stop accepting, answer with Connection: close, exit when the connections are gone.
    worker.draining = True
    sd_notify("STOPPING=1")
    for server in serving.servers:
        server.close()
    deadline = time.monotonic() + DRAIN_SECONDS
    while serving.server_state.connections and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    serving.should_exit = True
    admin.should_exit = True
    await asyncio.gather(serving_task, admin_task, return_exceptions=True)
    log(f"worker {index}: drained, exiting")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="provisioner's model server (one worker, or --check of the registry)")
    parser.add_argument("--config", required=True, help="serving.json, written by the serving role")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--worker", type=int, metavar="I", help="serve as worker I of the config")
    mode.add_argument("--check", action="store_true", help="load every listed version once and compare the total with the budget")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        if args.check:
            set_threads(1)
            return check(config)
        if not 0 <= args.worker < len(config["workers"]):
            raise BadInput(f"worker {args.worker} is not in {args.config} (it lists workers 0..{len(config['workers']) - 1})")
        spec = config["workers"][args.worker]
        set_threads(spec["threads"])  # before numpy or any framework starts its thread pools
        set_affinity(spec["cpus"])
        for module, package in (
            ("numpy", "numpy"),
            ("starlette", "starlette"),
            ("uvicorn", "uvicorn"),
            ("prometheus_client", "prometheus-client"),
        ):
            try:
                __import__(module)
            except ImportError:
                raise BadInput(
                    f"the ML environment lacks {package}, which the server needs: add the mlstack component serving"
                ) from None
        try:
            import uvloop

            loop_factory = uvloop.new_event_loop
        except ImportError:
            loop_factory = None
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(run_worker(config, args.worker, args.config))
    except BadInput as exc:
        print(f"provisioner_serve: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD


if __name__ == "__main__":
    sys.exit(main())
