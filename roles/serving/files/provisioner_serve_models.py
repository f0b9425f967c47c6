"""The model server's models: loading each framework's version, its memory, predicting,
and the registry check (provisioner_serve.py --check).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import provisioner_serve_engines as engines
from provisioner_serve_config import (
    _NUMBERS,
    FRAMEWORKS,
    BadInput,
    Metadata,
    ModelError,
    Registry,
    RequestError,
    files_bytes,
)

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
            return _native(fast, booster), booster.num_features()
    return _native(predict, booster), booster.num_features()


def _native(predict: Predict, model: Any) -> Predict:
    """PREDICT with the framework's loaded MODEL beside it, which an engine may convert (engines.choose)."""
    predict.model = model  # type: ignore[attr-defined]
    return predict


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

    return _native(predict, booster), booster.num_feature()


def _load_catboost(meta: Metadata, threads: int) -> tuple[Predict, int | None]:
    import catboost

    model = catboost.CatBoost()
    model.load_model(str(meta.file), format="cbm")
    kind = "Probability" if meta.task == "classification" else "RawFormulaVal"

    def predict(x: Any) -> Any:
        return model.predict(x, prediction_type=kind, thread_count=threads)

    names = model.feature_names_
    return _native(predict, model), len(names) if names is not None else None


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

    __slots__ = ("bytes", "engine", "features", "framework", "index", "n", "name", "np", "predict_fn", "task", "version")

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
        self.engine = engines.Engine("native", None, None, "not measured")

    def predict(self, rows: Any) -> list[Any]:
        """Rows (a float32 array, n columns) -> one float, or a list of floats, per row."""
        return self.predict_array(rows).tolist()

    def predict_array(self, rows: Any) -> Any:
        """Rows -> a float64 array: one value per row, or one per class (engines.normalized)."""
        out = engines.normalized(self.np, self.predict_fn(rows), self.task)
        if out.ndim not in (1, 2) or out.shape[0] != rows.shape[0]:
            raise ValueError(f"the model returned shape {out.shape} for {rows.shape[0]} rows")
        return out

    def npy_rows(self, raw: bytes | bytearray, max_rows: int, max_bytes: int) -> Any:
        """A .npy body (rows x features in the version's order, numbers) as a float32 array; 4xx naming
        what is wrong. The header is checked against the body's length before any array exists, and
        the rows are a view of the body (float32 in C order: no copy; else one float32 copy, itself
        within MAX_BYTES: a batch takes at most twice max_batch_bytes beside the cache)."""
        import io

        np = self.np
        fmt = np.lib.format
        head = io.BytesIO(bytes(raw[:65536]))
        try:
            version = fmt.read_magic(head)
            if version == (1, 0):
                shape, fortran, dtype = fmt.read_array_header_1_0(head)
            elif version == (2, 0):
                shape, fortran, dtype = fmt.read_array_header_2_0(head)
            else:
                raise ValueError(f"format version {version[0]}.{version[1]} (numpy.save writes 1.0)")
        except Exception as exc:  # numpy says what is wrong with the header
            raise RequestError(400, f"the body is not a .npy array: {str(exc).strip()[:200]}") from None
        if dtype.hasobject or dtype.kind not in "fiu" or dtype.shape:
            raise RequestError(422, f"the array's dtype is {dtype}, not numbers")
        if len(shape) != 2 or shape[1] != self.n:
            raise RequestError(
                422,
                f"an array of shape {shape}, but {self.name}/{self.version} takes rows x {self.n} features "
                f"in order: {_some(self.features, 5)}",
            )
        if shape[0] == 0:
            raise RequestError(422, "the array has no rows")
        if shape[0] > max_rows:
            raise RequestError(413, f"{shape[0]} rows are above max_batch_rows {max_rows}")
        if shape[0] * shape[1] * 4 > max_bytes:  # the float32 rows the predict takes, beside the body
            raise RequestError(
                413, f"{shape[0]} rows take {shape[0] * shape[1] * 4} bytes as float32, above max_batch_bytes {max_bytes}"
            )
        offset = head.tell()
        want = offset + shape[0] * shape[1] * dtype.itemsize
        if len(raw) != want:
            raise RequestError(400, f"the body has {len(raw)} bytes; its .npy header declares {want}")
        flat = np.frombuffer(raw, dtype=dtype, count=shape[0] * shape[1], offset=offset)
        rows = flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)
        if rows.dtype != np.float32 or not rows.flags.c_contiguous:
            try:
                with np.errstate(over="raise"):
                    rows = np.ascontiguousarray(rows, dtype=np.float32)
            except FloatingPointError:
                raise RequestError(422, "features out of range for float32") from None
        # a body that came in one piece is read-only bytes; a header of odd length misaligns the rows
        return rows if rows.flags.writeable and rows.flags.aligned else rows.copy()

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
            with self.np.errstate(over="raise"):
                array = self.np.array(rows, dtype=self.np.float32)
        except (OverflowError, ValueError, FloatingPointError) as exc:
            raise RequestError(422, f"features out of range for float32: {exc}") from None
        if self.np.isinf(array).any():  # JSON has no infinity: a number like 1e400 read as one
            raise RequestError(422, "features out of range for float32: a number beyond the float range")
        return array

    def warm(self, requests: int) -> None:
        zero = self.np.zeros((1, self.n), dtype=self.np.float32)
        for _ in range(requests):
            self.predict(zero)


def _some(items: list[str], limit: int = 10) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def load_model(
    registry: Registry, name: str, version: str, threads: int, allowed: list[str] | tuple[str, ...] = engines.KNOWN
) -> Model:
    """Load one version, predict one zero row, then let the ALLOWED engines compete with the
    framework's own predict (engines.choose); ModelError names the file on any failure."""
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
    native = getattr(predict_fn, "model", None)
    try:
        model.predict_fn, model.engine = engines.choose(
            meta.framework, meta.task, model.n, predict_fn, native, threads, list(allowed)
        )
    except Exception as exc:  # the framework's own predict works (above): it serves
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        model.engine = engines.Engine("native", None, None, f"engines not tried: {first[:200]}")
    if model.predict_fn is not predict_fn:
        del predict_fn, native  # an engine serves: the framework's model is garbage now
    if meta.framework in engines.CANDIDATES and allowed:
        # Engines were tried: the conversions' scratch and any engine that lost are garbage too.
        # Free them before the version's bytes are read, or the cache counts them.
        gc.collect()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
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
                models.append(load_model(registry, name, version, 1, config["engines"]))
        except ModelError as exc:
            raise BadInput(str(exc)) from None
    total = sum(m.bytes for m in models)
    if total > config["cache_budget_bytes"]:
        raise BadInput(over_budget_message(models, config["cache_budget_bytes"]))
    print(
        json.dumps(
            {
                "models": [{"name": m.name, "version": m.version, "bytes": m.bytes, "engine": m.engine.name} for m in models],
                "total_bytes": total,
            }
        )
    )
    return 0


# ---------------------------------------------------------------------------------------
# Worker state: cache and metrics
