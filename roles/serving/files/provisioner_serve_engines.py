"""Predictor engines: which code predicts a loaded tree-ensemble version, chosen at load by
measurement (docs/serving.md, "Engines").

The framework's own predict (XGBoost's, LightGBM's, CatBoost's: "native") always serves unless
an engine present in the ML environment and allowed by the config (`engines`) does better:
- it gives the native predictions on the version's validation rows (the same class for every
  row of a classifier, every value within TOLERANCE of the native one), and
- one row at a time on this worker's thread(s) it is faster than native (medians of
  interleaved rounds, by more than MARGIN).

Engines:
- onedal: oneDAL's gradient-boosting model builders (daal4py.mb, shipped in the mlstack
  component sklearnex), which convert an XGBoost, LightGBM or CatBoost model into oneDAL's own.

Standard library only at import; numpy and the engines' packages are imported by the worker.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

Predict = Callable[[Any], Any]

# framework -> the engines that can take its models over, in the order they are tried
CANDIDATES: dict[str, tuple[str, ...]] = {"xgboost": ("onedal",), "lightgbm": ("onedal",), "catboost": ("onedal",)}
KNOWN = ("onedal",)
# The import each engine needs, and the mlstack component that installs it.
PACKAGES = {"onedal": ("daal4py", "sklearnex")}
# |engine - native| <= TOLERANCE * max(1, |native|) on every validation row: float32 trees summed
# in another order differ by about 1e-7 of the value.
TOLERANCE = 1e-5
VALIDATION_ROWS = 256
ROUNDS, CALLS = 7, 30
MARGIN = 0.05  # an engine must be 5% faster than native to take over (noise is not a gain)


class Engine:
    """What serves one loaded version: its engine, its measured single-row predict time and
    native's, and why (a candidate that was not taken says what it lost on)."""

    __slots__ = ("name", "native_us", "predict_us", "reason")

    def __init__(self, name: str, predict_us: float | None, native_us: float | None, reason: str) -> None:
        self.name, self.predict_us, self.native_us, self.reason = name, predict_us, native_us, reason

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "predict_us": _round(self.predict_us),
            "native_predict_us": _round(self.native_us),
            "engine_reason": self.reason,
        }


def _round(us: float | None) -> float | None:
    return None if us is None else round(us, 2)


def validation_rows(np: Any, n: int) -> Any:
    """VALIDATION_ROWS rows of N features, the same on every worker: a zero row, then normal values
    each scaled by its own power of ten between 0.01 and 10,000, both signs (a tree's thresholds
    sit at any magnitude: incomes, counts, ratios)."""
    rng = np.random.default_rng(20261205)
    rows = rng.standard_normal((VALIDATION_ROWS, n)) * 10.0 ** rng.uniform(-2.0, 4.0, size=(VALIDATION_ROWS, n))
    rows[0] = 0.0
    return rows.astype(np.float32)


def normalized(np: Any, out: Any, task: str) -> Any:
    """A predict function's output as the server answers it: one value per row, or one per class
    (a binary classifier's two columns become the positive class's probability)."""
    out = np.asarray(out, dtype=np.float64)
    if out.ndim == 2 and out.shape[1] == 1:
        out = out[:, 0]
    elif out.ndim == 2 and out.shape[1] == 2 and task == "classification":
        out = out[:, 1]
    return out


def mismatch(np: Any, native: Any, engine: Any, task: str) -> str | None:
    """Why ENGINE's predictions are not NATIVE's (both normalized), or None when they match."""
    if native.shape != engine.shape:
        return f"it returned shape {engine.shape}, native {native.shape}"
    if task == "classification":
        classes = (lambda p: p.argmax(axis=1)) if native.ndim == 2 else (lambda p: p >= 0.5)
        other = int((classes(native) != classes(engine)).sum())
        if other:
            return f"{other} of {native.shape[0]} validation rows fell in another class"
    finite = np.isfinite(native)
    if not np.array_equal(finite, np.isfinite(engine)):
        return "it gives a non-finite value where native does not, or the other way round"
    diff = np.abs(engine[finite] - native[finite])
    bound = TOLERANCE * np.maximum(1.0, np.abs(native[finite]))
    if bool((diff > bound).any()):
        return f"its predictions differ from native by up to {float(diff.max()):.3g} (tolerance {TOLERANCE:g} relative)"
    return None


def _per_call_us(predicts: list[Predict], row: Any, rounds: int = ROUNDS, calls: int = CALLS, warm: bool = True) -> list[float]:
    """Each function's median single-row predict time (µs), measured in interleaved rounds so a
    busy moment of the machine falls on all of them alike."""
    if warm:
        for f in predicts:
            for _ in range(calls):
                f(row)
    times: list[list[float]] = [[] for _ in predicts]
    for _ in range(rounds):
        for i, f in enumerate(predicts):
            start = time.perf_counter()
            for _ in range(calls):
                f(row)
            times[i].append((time.perf_counter() - start) / calls * 1e6)
    return [statistics.median(t) for t in times]


_ONEDAL_THREADS: list[int] = []  # set once per process: a worker's threads do not change
_ONEDAL_LOCK = threading.Lock()


def _onedal(model: Any, task: str, threads: int) -> Predict:
    import daal4py

    # oneDAL's thread count is the process's, not the model's: set it once, before the first
    # conversion, never while another thread may be predicting through it.
    with _ONEDAL_LOCK:
        if not _ONEDAL_THREADS:
            daal4py.daalinit(threads)
            _ONEDAL_THREADS.append(threads)
    converted = daal4py.mb.convert_model(model)
    return converted.predict_proba if task == "classification" else converted.predict


BUILDERS: dict[str, Callable[[Any, str, int], Predict]] = {"onedal": _onedal}


def choose(
    framework: str, task: str, n: int, native: Predict, model: Any, threads: int, allowed: list[str]
) -> tuple[Predict, Engine]:
    """The predict function that serves this version and its Engine (see the module's docstring).
    MODEL is the framework's loaded model (what an engine converts); N the features. Native's
    single-row time is measured for every version, engines or not."""
    import numpy as np

    rows = validation_rows(np, n)
    names = [e for e in CANDIDATES.get(framework, ()) if e in allowed]
    takers: list[tuple[str, Predict]] = []
    reasons: list[str] = []
    if framework not in CANDIDATES:
        reasons.append(f"no engine takes {framework} models")
    elif not names:
        reasons.append("no engine allowed (serving_engines is empty)")
    elif model is None:
        reasons.append(f"the {framework} loader kept no model an engine could convert")
    else:
        expected = normalized(np, native(rows), task)
        for name in names:
            module, component = PACKAGES[name]
            try:
                __import__(module)
            except ImportError:
                reasons.append(f"{name}: not in the ML environment (add the mlstack component {component})")
                continue
            try:
                predict = BUILDERS[name](model, task, threads)
                why = mismatch(np, expected, normalized(np, predict(rows), task), task)
            except Exception as exc:  # an engine that cannot take the model is only not used
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                why = f"it could not take the model ({first[:200]})"
            if why:
                reasons.append(f"{name}: {why}")
            else:
                takers.append((name, predict))
    if not takers:
        # Only native's own time, for status and the metrics: a few calls (the load warmed it).
        native_us = _per_call_us([native], rows[:1], rounds=3, calls=5, warm=False)[0]
        return native, Engine("native", native_us, native_us, "; ".join(reasons))
    times = _per_call_us([native, *(p for _, p in takers)], rows[:1])
    native_us = times[0]
    best = min(range(len(takers)), key=lambda i: times[i + 1])
    name, predict = takers[best]
    us = times[best + 1]
    for i, (other, _) in enumerate(takers):
        if i != best:
            reasons.append(f"{other}: {times[i + 1]:.1f} µs a row, slower than {name}")
    if us < native_us * (1 - MARGIN):
        reasons.insert(0, f"{name}: {us:.1f} µs a row against native {native_us:.1f} µs, the same predictions")
        return predict, Engine(name, us, native_us, "; ".join(reasons))
    reasons.insert(0, f"{name}: {us:.1f} µs a row, not {MARGIN:.0%} faster than native {native_us:.1f} µs")
    return native, Engine("native", native_us, native_us, "; ".join(reasons))
