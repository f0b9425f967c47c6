"""The model server's predictor engines (roles/serving/files/provisioner_serve_engines.py): which
code predicts a loaded version, chosen at load by equal predictions and measured speed.

In this process, through the server's own load_model (the smoke test's serving workload loads it
the same way), on real XGBoost and LightGBM models and real oneDAL (daal4py, from
scikit-learn-intelex); the decisions that depend on the machine's speed are held with a measure
that answers fixed times, so they cannot flip with the machine's load.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import joblib
import lightgbm
import numpy as np
import pytest
import xgboost
from sklearn.linear_model import LogisticRegression

from provisioner.smoke.workloads import serving as serving_workload

ROOT = Path(__file__).resolve().parents[2]
# The server puts its own directory on sys.path: its parts import by name, as on a host.
serve = serving_workload._serve_module(str(ROOT / "roles" / "serving" / "files" / "provisioner_serve.py"))
engines = sys.modules["provisioner_serve_engines"]

N = 8


def _data(task: str, classes: int = 2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(600, N)) * np.array([10.0 ** (i % 3) for i in range(N)])).astype(np.float32)
    signal = x[:, 0] + 0.1 * x[:, 1] + np.sin(x[:, 2])
    if task == "regression":
        return x, (signal * 3 + 50).astype(np.float32)
    return x, np.digitize(signal, np.quantile(signal, np.linspace(0, 1, classes + 1)[1:-1]))


def _version(registry: Path, name: str, framework: str, task: str, classes: int = 2) -> Any:
    """Train and save one version; returns the model as its framework holds it."""
    model: Any
    directory = registry / name / "1"
    directory.mkdir(parents=True)
    x, y = _data(task, classes)
    if framework == "xgboost":
        params: dict[str, Any] = {"max_depth": 4, "nthread": 1}
        if task == "classification":
            params.update(objective="multi:softprob", num_class=classes) if classes > 2 else params.update(
                objective="binary:logistic"
            )
        model = xgboost.train(params, xgboost.DMatrix(x, label=y), 40)
        model.save_model(str(directory / "model.ubj"))
        file = "model.ubj"
    elif framework == "lightgbm":
        params = {"verbose": -1, "num_threads": 1}
        if task == "classification":
            params.update(objective="multiclass", num_class=classes) if classes > 2 else params.update(objective="binary")
        model = lightgbm.train(params, lightgbm.Dataset(x, label=y), 40)
        model.save_model(str(directory / "model.txt"))
        file = "model.txt"
    else:
        model = LogisticRegression(max_iter=500).fit(x, y)
        joblib.dump(model, directory / "model.joblib")
        file = "model.joblib"
    meta = {"framework": framework, "file": file, "features": [f"f{i}" for i in range(N)], "task": task}
    (directory / "metadata.json").write_text(json.dumps(meta))
    return model


def _native_predict(model: Any, framework: str, rows: np.ndarray) -> np.ndarray:
    out = model.inplace_predict(rows) if framework == "xgboost" else model.predict(rows)
    out = np.asarray(out, dtype=np.float64)
    return out


def _rows() -> np.ndarray:
    rng = np.random.default_rng(11)
    return (rng.normal(size=(200, N)) * np.array([10.0 ** (i % 3) for i in range(N)])).astype(np.float32)


@pytest.fixture
def timed(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[float]]:
    """The measure answers these times (µs): native first, then each engine that matched."""
    times: dict[str, list[float]] = {"us": [100.0, 10.0]}
    monkeypatch.setattr(engines, "_per_call_us", lambda predicts, row, **_: times["us"][: len(predicts)])
    return times


CASES = [
    ("xgboost", "regression", 2),
    ("xgboost", "classification", 2),
    ("xgboost", "classification", 3),
    ("lightgbm", "regression", 2),
    ("lightgbm", "classification", 2),
    ("lightgbm", "classification", 3),
]


@pytest.mark.parametrize(("framework", "task", "classes"), CASES)
def test_onedal_serves_a_tree_ensemble_when_faster_with_native_predictions_within_the_tolerance(
    framework: str, task: str, classes: int, tmp_path: Path, timed: dict[str, list[float]]
) -> None:
    trained = _version(tmp_path, "m", framework, task, classes)
    model = serve.load_model(serve.Registry(str(tmp_path)), "m", "1", 1)
    assert model.engine.name == "onedal", model.engine.reason
    assert model.engine.to_dict() == {
        "engine": "onedal",
        "predict_us": 10.0,
        "native_predict_us": 100.0,
        "engine_reason": "onedal: 10.0 µs a row against native 100.0 µs, the same predictions",
    }
    rows = _rows()
    served = np.asarray(model.predict(rows))
    native = engines.normalized(np, _native_predict(trained, framework, rows), task)
    assert served.shape == native.shape
    assert np.all(np.abs(served - native) <= engines.TOLERANCE * np.maximum(1.0, np.abs(native)))
    # It is oneDAL's model that answers, not the framework's.
    assert type(model.predict_fn.__self__).__name__ == "GBTDAALModel"


def test_an_engine_not_faster_than_native_by_the_margin_leaves_native_serving(
    tmp_path: Path, timed: dict[str, list[float]]
) -> None:
    trained = _version(tmp_path, "m", "xgboost", "regression")
    timed["us"] = [100.0, 96.0]
    model = serve.load_model(serve.Registry(str(tmp_path)), "m", "1", 1)
    assert model.engine.name == "native"
    assert model.engine.reason == "onedal: 96.0 µs a row, not 5% faster than native 100.0 µs"
    rows = _rows()
    assert model.predict(rows) == [float(v) for v in trained.inplace_predict(rows)]


def test_an_engine_whose_predictions_differ_is_not_used_and_the_reason_says_by_how_much(
    tmp_path: Path, timed: dict[str, list[float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _version(tmp_path, "m", "xgboost", "regression")
    real = engines.BUILDERS["onedal"]

    def off(model: Any, task: str, threads: int) -> Any:
        predict = real(model, task, threads)
        return lambda x: predict(x) + 0.01

    monkeypatch.setitem(engines.BUILDERS, "onedal", off)
    model = serve.load_model(serve.Registry(str(tmp_path)), "m", "1", 1)
    assert model.engine.name == "native"
    assert model.engine.reason.startswith("onedal: its predictions differ from native by up to 0.01"), model.engine.reason


def test_a_classifier_engine_that_moves_a_row_to_another_class_is_not_used(
    tmp_path: Path, timed: dict[str, list[float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _version(tmp_path, "m", "lightgbm", "classification")
    monkeypatch.setitem(engines.BUILDERS, "onedal", lambda model, task, threads: lambda x: 1.0 - model.predict(x))
    model = serve.load_model(serve.Registry(str(tmp_path)), "m", "1", 1)
    assert model.engine.name == "native"
    assert "validation rows fell in another class" in model.engine.reason, model.engine.reason


def test_without_the_engines_package_or_with_none_allowed_native_serves_saying_why(
    tmp_path: Path, timed: dict[str, list[float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _version(tmp_path, "m", "xgboost", "regression")
    _version(tmp_path, "s", "sklearn", "classification")
    registry = serve.Registry(str(tmp_path))
    none = serve.load_model(registry, "m", "1", 1, [])
    assert (none.engine.name, none.engine.reason) == ("native", "no engine allowed (serving_engines is empty)")
    assert none.engine.predict_us == 100.0  # native's own time, measured all the same
    skl = serve.load_model(registry, "s", "1", 1)
    assert (skl.engine.name, skl.engine.reason) == ("native", "no engine takes sklearn models")
    monkeypatch.setitem(engines.PACKAGES, "onedal", ("no_such_daal4py", "sklearnex"))
    missing = serve.load_model(registry, "m", "1", 1)
    assert missing.engine.name == "native"
    assert missing.engine.reason == "onedal: not in the ML environment (add the mlstack component sklearnex)"


def test_an_engine_that_cannot_take_the_model_is_skipped_with_its_error(
    tmp_path: Path, timed: dict[str, list[float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _version(tmp_path, "m", "lightgbm", "regression")

    def refuse(model: Any, task: str, threads: int) -> Any:
        raise TypeError("unsupported model\nmore lines")

    monkeypatch.setitem(engines.BUILDERS, "onedal", refuse)
    model = serve.load_model(serve.Registry(str(tmp_path)), "m", "1", 1)
    assert (model.engine.name, model.engine.reason) == ("native", "onedal: it could not take the model (unsupported model)")


def test_the_real_measure_times_native_and_the_engine_on_one_row(tmp_path: Path) -> None:
    """Unpatched: both times are measured and the faster one (beyond the margin) serves."""
    _version(tmp_path, "m", "xgboost", "regression")
    model = serve.load_model(serve.Registry(str(tmp_path)), "m", "1", 1)
    e = model.engine
    assert e.native_us is not None and e.native_us > 0 and e.predict_us is not None and e.predict_us > 0
    if e.name == "onedal":
        assert e.predict_us < e.native_us * (1 - engines.MARGIN)
    else:
        assert e.name == "native" and "not 5% faster than native" in e.reason, e.reason


def test_a_non_finite_value_on_one_side_only_is_a_mismatch() -> None:
    native = np.array([0.5, np.nan, 2.0])
    assert engines.mismatch(np, native, np.array([0.5, np.nan, 2.0]), "regression") is None
    assert engines.mismatch(np, native, np.array([0.5, 1.0, 2.0]), "regression") == (
        "it gives a non-finite value where native does not, or the other way round"
    )
    assert engines.mismatch(np, np.array([0.5, 1.0]), np.array([0.5, np.inf]), "regression") is not None
    assert "differ from native by up to 0.1" in engines.mismatch(np, native, np.array([0.6, np.nan, 2.0]), "regression")


@pytest.mark.parametrize(
    ("value", "ok"), [(None, True), ([], True), (["onedal"], True), (["treelite"], False), ("onedal", False), ([1], False)]
)
def test_the_config_takes_only_known_engines(tmp_path: Path, value: Any, ok: bool) -> None:
    doc: dict[str, Any] = {
        "schema": 1,
        "registry": str(tmp_path),
        "listen": "127.0.0.1",
        "port": 0,
        "admin_port_base": 9000,
        "workers": [{"index": 0, "cpus": [0], "threads": 1}],
        "cache_budget_bytes": 1 << 20,
        "models": "all",
        "max_body_bytes": 1024,
        "max_batch_rows": 1,
        "warmup_requests": 0,
    }
    if value is not None:
        doc["engines"] = value
    path = tmp_path / "serving.json"
    path.write_text(json.dumps(doc))
    if ok:
        assert serve.load_config(str(path))["engines"] == (["onedal"] if value is None else value)
    else:
        with pytest.raises(serve.BadInput, match=r"engines must be a list of onedal \(or \[\] for the frameworks' own predict\)"):
            serve.load_config(str(path))


@pytest.mark.parametrize(
    "raw",
    [
        b'{"features": {"a": 1.5, "b": -2, "c": 1e-7, "d": 12345678901234567890}}',
        b'{"rows": [[0.1, 0.2], [3, 4]]}',
        b'{"features": {"a": NaN}}',
        b'{"features": {"a": -Infinity}}',
        b'{"features": {"a": 1.0,',
        b"[1, 2]",
        b"",
    ],
)
def test_the_servers_json_reads_and_refuses_what_the_standard_library_does(raw: bytes) -> None:
    """orjson parses the bodies (where installed); what it refuses, the standard library reads again
    for its message: NaN and Infinity are refused naming them, an integer beyond 64 bits is read."""
    app = sys.modules["provisioner_serve_app"]
    assert app.loads is not app._stdlib_loads, "orjson is a test dependency: the fast path is the one under test"
    try:
        want: Any = app._stdlib_loads(raw)
    except ValueError as exc:
        want = f"error: {exc}"
    try:
        got: Any = app.loads(raw)
    except ValueError as exc:
        got = f"error: {exc}"
    assert got == want
    doc = {"model": "m", "version": "1", "predictions": [0.1, 1e-300, 123456789.123, [0.25, 0.75]]}
    assert app.dumps(doc) == app._stdlib_dumps(doc)
