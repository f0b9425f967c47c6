"""The model server (roles/serving/files/provisioner_serve.py), run for real.

Each server is a real subprocess on free loopback ports, serving a registry of real models
trained here (XGBoost, scikit-learn, LightGBM), talked to over HTTP. One server is shared by
the tests whose state allows it; the cache, check and drain tests start their own.
"""

from __future__ import annotations

import http.client
import importlib.util
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import joblib
import lightgbm
import numpy as np
import pytest
import xgboost
from prometheus_client.parser import text_string_to_metric_families
from sklearn.linear_model import LogisticRegression

from provisioner.smoke.workloads import serving as serving_workload

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "roles" / "serving" / "files" / "provisioner_serve.py"
CPUS = sorted(os.sched_getaffinity(0))
START_TIMEOUT = 90.0
PAD = 40 << 20  # apparent size of the sparse padding file of each cache-test version


# ---------------------------------------------------------------------------------------
# Models and registry


def features(n: int) -> list[str]:
    return [f"f{i}" for i in range(n)]


def training_data(n_features: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(300, n_features)).astype(np.float32)
    y = x[:, 0] * 2.0 + x[:, 1] ** 2 - x[:, 2] + rng.normal(scale=0.1, size=300)
    return x, y


def write_version(registry: Path, name: str, version: str, framework: str, file: str, n: int, task: str | None = None) -> Path:
    directory = registry / name / version
    directory.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"framework": framework, "file": file, "features": features(n)}
    if task:
        meta["task"] = task
    (directory / "metadata.json").write_text(json.dumps(meta))
    return directory


def xgb_model(
    registry: Path, name: str, version: str, n: int = 6, seed: int = 0, trees: int = 20, task: str | None = None
) -> xgboost.Booster:
    x, y = training_data(n, seed)
    params: dict[str, Any] = {"max_depth": 3, "nthread": 1, "seed": seed}
    if task == "classification":
        params["objective"] = "binary:logistic"
        y = (y > np.median(y)).astype(np.float32)
    booster = xgboost.train(params, xgboost.DMatrix(x, label=y), trees)
    directory = write_version(registry, name, version, "xgboost", "model.ubj", n, task)
    booster.save_model(str(directory / "model.ubj"))
    return booster


def sklearn_model(registry: Path, name: str, version: str, n: int = 5) -> LogisticRegression:
    x, y = training_data(n, 3)
    model = LogisticRegression().fit(x, (y > np.median(y)).astype(int))
    directory = write_version(registry, name, version, "sklearn", "model.joblib", n, "classification")
    joblib.dump(model, directory / "model.joblib")
    return model


def lgb_model(registry: Path, name: str, version: str, n: int = 4) -> lightgbm.Booster:
    x, y = training_data(n, 4)
    booster = lightgbm.train(
        {"objective": "regression", "num_leaves": 7, "verbose": -1, "num_threads": 1},
        lightgbm.Dataset(x, label=y),
        num_boost_round=15,
    )
    directory = write_version(registry, name, version, "lightgbm", "model.txt", n)
    booster.save_model(str(directory / "model.txt"))
    return booster


def pad(directory: Path, size: int = PAD) -> None:
    """A sparse file: the version's size on disk (the floor of its bytes) without using disk."""
    with open(directory / "padding.bin", "wb") as handle:
        handle.truncate(size)


# ---------------------------------------------------------------------------------------
# Servers and HTTP


# The serving workload's: a port p with p .. p+count-1 free on 127.0.0.1, as the throwaway servers on the hosts use.
free_base = serving_workload.free_ports


def write_config(
    path: Path,
    registry: Path,
    models: Any,
    *,
    workers: int = 1,
    budget: int = 1 << 30,
    max_body: int = 65536,
    max_rows: int = 50,
    warmup: int = 20,
    max_batch: int | None = None,
) -> dict[str, Any]:
    base = free_base(1 + workers)
    config = {
        "schema": 1,
        "registry": str(registry),
        "listen": "127.0.0.1",
        "port": base,
        "admin_port_base": base + 1,
        "workers": [{"index": i, "cpus": [CPUS[i % len(CPUS)]], "threads": 1} for i in range(workers)],
        "cache_budget_bytes": budget,
        "models": models,
        "max_body_bytes": max_body,
        "max_batch_rows": max_rows,
        "warmup_requests": warmup,
    }
    if max_batch is not None:  # else the server's default (a config from before binary batches)
        config["max_batch_bytes"] = max_batch
    path.write_text(json.dumps(config))
    return config


def call(
    port: int, method: str, path: str, body: Any = None, raw: bytes | None = None, conn: http.client.HTTPConnection | None = None
) -> tuple[int, Any, http.client.HTTPResponse]:
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    headers = {"Content-Type": "application/json"} if data is not None else {}
    try:
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        payload = response.read()
    finally:
        if own:
            conn.close()
    ctype = response.getheader("content-type", "")
    return response.status, json.loads(payload) if ctype.startswith("application/json") else payload.decode(), response


class Server:
    """One worker subprocess: started, waited for, stopped with SIGTERM."""

    def __init__(
        self,
        config_path: Path,
        config: dict[str, Any],
        index: int = 0,
        env: dict[str, str] | None = None,
        inherit: socket.socket | None = None,
    ) -> None:
        self.config = config
        self.index = index
        self.port = config["port"]
        self.admin = config["admin_port_base"] + index
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (open for the life of the server)
        self.final_output = ""
        full_env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID")}
        full_env.update(env or {})
        command = [sys.executable, str(SERVER), "--config", str(config_path), "--worker", str(index)]
        fds: tuple[int, ...] = ()
        if inherit is not None:
            # what systemd does for a socket unit's service: the socket as fd 3, LISTEN_PID/LISTEN_FDS
            fd = inherit.fileno()
            fds = (fd,)
            wrapper = (
                f"import os, sys; os.dup2({fd}, 3); os.close({fd}); "
                "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1'); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
            )
            command = [sys.executable, "-c", wrapper, *command[1:]]
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=full_env, pass_fds=fds)

    def output(self) -> str:
        if self.log.closed:  # stopped: what it wrote until then
            return self.final_output
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def readyz(self) -> int | None:
        try:
            return call(self.admin, "GET", "/readyz")[0]
        except OSError:
            return None

    def wait_ready(self, seen: list[int | None] | None = None) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker {self.index} exited {self.proc.returncode} before ready:\n{self.output()}")
            status = self.readyz()
            if seen is not None:
                seen.append(status)
            if status == 200:
                return
            time.sleep(0.02)
        raise AssertionError(f"worker {self.index} not ready in {START_TIMEOUT}s:\n{self.output()}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.log.closed:
            # Kept for a failed test's message (`assert server.stop() == 0, server.output()`).
            self.final_output = self.output()
            self.log.close()
        return self.proc.returncode

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, text, _ = call(self.admin, "GET", "/metrics")
        assert status == 200
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def metric(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted({"worker": str(self.index), **labels}.items())))
        return self.metrics().get(key, 0.0)

    def models(self) -> dict[tuple[str, str], dict[str, Any]]:
        status, doc, _ = call(self.admin, "GET", "/v1/models")
        assert status == 200
        return {(m["name"], m["version"]): m for m in doc["models"]}


def run_check(config_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SERVER), "--config", str(config_path), "--check"], capture_output=True, text=True, timeout=120
    )


def same(expected: Any) -> Any:
    """The framework's own prediction as the server may answer it: through a predictor engine
    (provisioner_serve_engines), within its tolerance of 1e-5 of the value (at least 1e-5)."""
    value = [float(v) for v in expected] if isinstance(expected, list) else float(expected)
    return pytest.approx(value, rel=1e-5, abs=1e-5)


def row(n: int, seed: int) -> dict[str, float]:
    values = np.random.default_rng(seed).normal(size=n).astype(np.float32)
    return {f"f{i}": float(v) for i, v in enumerate(values)}


def as_array(mapping: dict[str, float]) -> np.ndarray:
    return np.array([list(mapping.values())], dtype=np.float32)


# ---------------------------------------------------------------------------------------
# The shared server: four frameworks and tasks listed, other versions on disk


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    top = tmp_path_factory.mktemp("serving")
    registry = top / "models"
    trained = {
        ("reg", "1"): xgb_model(registry, "reg", "1", seed=1),
        ("clf", "1"): xgb_model(registry, "clf", "1", seed=2, task="classification"),
        ("skl", "1"): sklearn_model(registry, "skl", "1"),
        ("lgb", "1"): lgb_model(registry, "lgb", "1"),
        # unlisted: loaded on first request; numeric order makes 10 the latest, not 2
        ("lat", "2"): xgb_model(registry, "lat", "2", seed=5),
        ("lat", "10"): xgb_model(registry, "lat", "10", seed=6),
    }
    broken = write_version(registry, "broken", "1", "xgboost", "model.ubj", 6)
    (broken / "model.ubj").write_bytes(b"not a model at all\x00\x01")
    listed = [{"name": n, "version": v} for n, v in (("reg", "1"), ("clf", "1"), ("skl", "1"), ("lgb", "1"))]
    config_path = top / "serving.json"
    config = write_config(config_path, registry, listed, max_body=4096, max_rows=50, warmup=200, max_batch=8192)

    notify_dir = Path(tempfile.mkdtemp(prefix="pvn", dir="/tmp"))
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_dir / "n"))
    notify.settimeout(START_TIMEOUT)
    server = Server(config_path, config, env={"NOTIFY_SOCKET": str(notify_dir / "n")})
    seen: list[int | None] = []
    try:
        server.wait_ready(seen)
        message = notify.recv(4096).decode()
        models_at_ready = server.models()
        yield {
            "server": server,
            "registry": registry,
            "trained": trained,
            "config": config,
            "seen": seen,
            "notify": message,
            "models_at_ready": models_at_ready,
            "listed": listed,
        }
    finally:
        notify.close()
        shutil.rmtree(notify_dir, ignore_errors=True)
        rc = server.stop()
        assert rc == 0, server.output()


def test_ready_only_after_every_listed_version_is_loaded_and_warmed(shared: dict[str, Any]) -> None:
    seen = shared["seen"]
    # The admin port answers while the models load: not ready (503), then ready.
    assert 503 in seen and seen[-1] == 200
    assert seen.index(200) > seen.index(503)
    assert "READY=1" in shared["notify"].splitlines()
    listed = {(m["name"], m["version"]) for m in shared["listed"]}
    at_ready = shared["models_at_ready"]
    assert {k for k, m in at_ready.items() if m["loaded"]} == listed
    assert {k for k, m in at_ready.items() if m["listed"]} == listed
    server = shared["server"]
    status, doc, _ = call(server.port, "GET", "/healthz")
    assert (status, doc) == (200, {"status": "ok", "worker": 0})
    status, doc, _ = call(server.port, "GET", "/v1/models")
    assert doc["worker"] == 0 and doc["threads"] == 1 and doc["cpus"] == [CPUS[0]]
    assert doc["cache_budget_bytes"] == shared["config"]["cache_budget_bytes"]
    loaded = [m for m in doc["models"] if m["loaded"]]
    assert doc["cache_bytes"] == sum(m["bytes"] for m in loaded)
    # a version's bytes are at least its files' size on disk
    for m in doc["models"]:
        directory = shared["registry"] / m["name"] / m["version"]
        assert m["bytes"] >= sum(f.stat().st_size for f in directory.iterdir())
    by_key = {(m["name"], m["version"]): m for m in doc["models"]}
    assert by_key[("reg", "1")]["framework"] == "xgboost" and by_key[("reg", "1")]["features"] == 6
    assert by_key[("lgb", "1")]["framework"] == "lightgbm" and by_key[("lgb", "1")]["features"] == 4
    # Each loaded version names what predicts it (tests/unit/test_serving_engines.py: how it is
    # chosen) and its single-row time measured at load, in /v1/models and in the metrics.
    for key in (("reg", "1"), ("clf", "1"), ("lgb", "1"), ("skl", "1")):
        m = by_key[key]
        assert m["engine"] in ("native", "onedal") and m["predict_us"] > 0 and m["engine_reason"], m
        seconds = server.metric("provisioner_serving_predict_seconds", model=key[0], version=key[1], engine=m["engine"])
        assert seconds == pytest.approx(m["predict_us"] / 1e6, rel=1e-2), m
    assert (by_key[("skl", "1")]["engine"], by_key[("skl", "1")]["engine_reason"]) == ("native", "no engine takes sklearn models")
    assert server.metric("provisioner_serving_loaded_versions") >= 4


def test_predictions_equal_the_in_process_models(shared: dict[str, Any]) -> None:
    server, trained = shared["server"], shared["trained"]
    rows = [row(6, s) for s in range(5)]
    expected = trained[("reg", "1")].inplace_predict(np.array([list(r.values()) for r in rows], dtype=np.float32))
    for r, want in zip(rows, expected, strict=True):
        status, doc, _ = call(server.port, "POST", "/v1/models/reg/1/predict", {"features": r})
        assert status == 200, doc
        assert doc == {"model": "reg", "version": "1", "prediction": same(want)}
    # batch, in feature order and by name
    matrix = [list(r.values()) for r in rows]
    for body in ({"rows": matrix}, {"rows": rows}):
        status, doc, _ = call(server.port, "POST", "/v1/models/reg/1/predict/batch", body)
        assert status == 200, doc
        assert doc["predictions"] == same([float(v) for v in expected])
    # binary classification: the positive class's probability
    r = row(6, 42)
    status, doc, _ = call(server.port, "POST", "/v1/models/clf/1/predict", {"features": r})
    want = float(trained[("clf", "1")].inplace_predict(as_array(r))[0])
    assert status == 200 and doc["prediction"] == same(want) and 0.0 < want < 1.0
    r = row(5, 7)
    status, doc, _ = call(server.port, "POST", "/v1/models/skl/1/predict", {"features": r})
    want = float(trained[("skl", "1")].predict_proba(as_array(r))[0, 1])
    assert status == 200 and doc["prediction"] == want
    r = row(4, 8)
    status, doc, _ = call(server.port, "POST", "/v1/models/lgb/1/predict", {"features": r})
    want = float(trained[("lgb", "1")].predict(as_array(r))[0])
    assert status == 200 and doc["prediction"] == same(want)
    assert server.metric("provisioner_serving_requests_total", model="reg", version="1", code="200") >= 7
    assert server.metric("provisioner_serving_request_duration_seconds_count", model="reg", version="1") >= 7


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v1/models/reg/1/predict", {"features": {f"f{i}": 1.0 for i in range(5)}}, 422, ["missing features: f5"]),
        ("/v1/models/reg/1/predict", {"features": {**{f"f{i}": 1.0 for i in range(6)}, "zz": 1}}, 422, ["extra features: zz"]),
        (
            "/v1/models/reg/1/predict",
            {"features": {**{f"f{i}": 1.0 for i in range(5)}, "f5": "1.5"}},
            422,
            ["non-numeric", "f5='1.5'"],
        ),
        (
            "/v1/models/reg/1/predict",
            {"features": {**{f"f{i}": 1.0 for i in range(5)}, "f5": True}},
            422,
            ["non-numeric", "f5=True"],
        ),
        (
            "/v1/models/reg/1/predict",
            {"features": {**{f"f{i}": 1.0 for i in range(5)}, "f5": None}},
            422,
            ["non-numeric", "f5=None"],
        ),
        ("/v1/models/reg/1/predict", {"rows": [[1.0] * 6]}, 422, ["features"]),
        ("/v1/models/reg/1/predict", [1, 2], 422, ["features"]),
        ("/v1/models/reg/1/predict/batch", {"rows": [[1.0] * 6, [1.0] * 5]}, 422, ["row 1", "5 values", "6 features"]),
        ("/v1/models/reg/1/predict/batch", {"rows": [[1.0] * 6, [1.0] * 5 + ["x"]]}, 422, ["row 1", "f5='x'"]),
        ("/v1/models/reg/1/predict/batch", {"rows": [{f"f{i}": 1.0 for i in range(5)}]}, 422, ["row 0", "missing features: f5"]),
        ("/v1/models/reg/1/predict/batch", {"rows": []}, 422, ["empty"]),
        ("/v1/models/reg/1/predict/batch", {"rows": [[0.0] * 6] * 51}, 413, ["51 rows", "max_batch_rows 50"]),
        (
            "/v1/models/reg/1/predict",
            {"features": {f"f{i}": 1.0 for i in range(6)}, "pad": "x" * 5000},
            413,
            ["max_body_bytes 4096"],
        ),
        ("/v1/models/nosuch/1/predict", {"features": {}}, 404, ["nosuch/1"]),
        ("/v1/models/reg/99/predict", {"features": {}}, 404, ["reg/99"]),
        ("/v1/models/nosuch/latest/predict", {"features": {}}, 404, ["nosuch"]),
        ("/v1/models/reg/1/predict", b'{"features": {"f0": 1.0,', 400, ["malformed JSON"]),
        ("/v1/models/reg/1/predict", b'{"features": {"f0": NaN}}', 400, ["malformed JSON", "NaN"]),
        ("/v1/models/reg/1/predict", b"[" * 3000, 400, ["malformed JSON", "nested too deeply"]),
        (
            "/v1/models/reg/1/predict",
            b'{"features": {"f0": 1, "f1": 1, "f2": 1, "f3": 1, "f4": 1, "f5": 1e400}}',
            422,
            ["out of range for float32"],
        ),
        # a lone surrogate in a name: read, and named back in the 422
        ("/v1/models/reg/1/predict", b'{"features": {"\\ud800": 1}}', 422, ["extra features: \ud800"]),
        ("/v1/nothing", None, 404, ["/v1/nothing"]),
    ],
)
def test_bad_requests_get_a_4xx_naming_the_problem_and_the_worker_keeps_serving(
    shared: dict[str, Any], path: str, body: Any, status: int, words: list[str]
) -> None:
    server = shared["server"]
    raw = body if isinstance(body, bytes) else None
    got, doc, _ = call(server.port, "POST" if body is not None else "GET", path, None if raw else body, raw=raw)
    assert got == status, doc
    for word in words:
        assert word in doc["error"]
    good = row(6, 1)
    got, doc, _ = call(server.port, "POST", "/v1/models/reg/1/predict", {"features": good})
    assert got == 200 and doc["prediction"] == same(shared["trained"][("reg", "1")].inplace_predict(as_array(good))[0])


@pytest.mark.parametrize(
    ("method", "path", "status", "error", "allow"),
    [
        ("GET", "/v1/models/reg/1/predict", 405, "GET /v1/models/reg/1/predict: Method Not Allowed", "POST"),
        ("POST", "/healthz", 405, "POST /healthz: Method Not Allowed", "GET, HEAD"),
        ("POST", "/v1/models/reg/1/explain", 404, "POST /v1/models/reg/1/explain: Not Found", None),
        ("POST", "/v1/models/reg/1/predict/batch/x", 404, "POST /v1/models/reg/1/predict/batch/x: Not Found", None),
        ("POST", "/v1/models//1/predict", 404, "POST /v1/models//1/predict: Not Found", None),
        ("GET", "/nothing/", 404, "GET /nothing: Not Found", None),
    ],
)
def test_routes_answer_a_wrong_method_with_405_and_an_unknown_path_with_404_keeping_the_connection(
    shared: dict[str, Any], method: str, path: str, status: int, error: str, allow: str | None
) -> None:
    """The request path has no framework: its routing answers as starlette's did (405 now with
    Allow; a trailing slash is the path without it, where starlette redirected), and a body sent
    with a refused request is read to its end, so the keep-alive connection serves the next one."""
    server = shared["server"]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        got, doc, response = call(server.port, method, path, {"features": row(6, 1)} if method == "POST" else None, conn=conn)
        assert (got, doc) == (status, {"error": error})
        assert response.getheader("allow") == allow
        assert response.getheader("connection") != "close"
        got, doc, _ = call(server.port, "POST", "/v1/models/reg/1/predict", {"features": row(6, 1)}, conn=conn)
        assert got == 200 and "prediction" in doc
        conn.request("HEAD", "/healthz")
        head = conn.getresponse()
        assert head.status == 200 and head.read() == b"" and int(head.getheader("content-length") or 0) > 0
        got, doc, _ = call(server.port, "GET", "/healthz/", conn=conn)
        assert (got, doc) == (200, {"status": "ok", "worker": 0})
    finally:
        conn.close()


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def call_npy(port: int, path: str, body: bytes, accept: str | None = None) -> tuple[int, Any, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Content-Type": "application/x-npy", **({"Accept": accept} if accept else {})}
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        payload = response.read()
    finally:
        conn.close()
    ctype = response.getheader("content-type", "")
    if ctype == "application/x-npy":
        return response.status, np.load(io.BytesIO(payload), allow_pickle=False), ctype
    return response.status, json.loads(payload), ctype


def test_a_npy_batch_is_predicted_as_the_json_rows_are_and_answered_as_npy_when_accepted(shared: dict[str, Any]) -> None:
    server = shared["server"]
    rng = np.random.default_rng(7)
    rows = rng.normal(size=(50, 6)).astype(np.float32)
    want = shared["trained"][("reg", "1")].inplace_predict(rows)
    got, doc, ctype = call_npy(server.port, "/v1/models/reg/1/predict/batch", npy(rows))
    assert (got, ctype) == (200, "application/json") and doc["model"] == "reg" and doc["version"] == "1"
    assert doc["predictions"] == [same(float(v)) for v in want]
    # float64 and integer arrays, Fortran order: converted to the float32 rows the JSON path builds
    for other in (rows.astype(np.float64), np.asfortranarray(rows), np.rint(rows * 10).astype(np.int64)):
        got, doc, _ = call_npy(server.port, "/v1/models/reg/1/predict/batch", npy(other))
        expected = shared["trained"][("reg", "1")].inplace_predict(other.astype(np.float32))
        assert got == 200 and doc["predictions"] == [same(float(v)) for v in expected]
    got, out, ctype = call_npy(server.port, "/v1/models/clf/1/predict/batch", npy(rows), accept="application/x-npy")
    assert (got, ctype, out.dtype, out.shape) == (200, "application/x-npy", np.float64, (50,))
    positive = shared["trained"][("clf", "1")].inplace_predict(rows)
    assert out.tolist() == [same(float(v)) for v in positive]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"\x93NUMPY garbage", 400, ["not a .npy array"]),
        (b'{"rows": [[1.0]]}', 400, ["not a .npy array"]),
        (npy(np.array([[object()] * 6], dtype=object)), 422, ["dtype is object"]),  # a pickle: never read
        (npy(np.zeros((3, 5), dtype=np.float32)), 422, ["shape (3, 5)", "reg/1 takes rows x 6 features", "f0"]),
        (npy(np.zeros(6, dtype=np.float32)), 422, ["shape (6,)"]),
        (npy(np.zeros((0, 6), dtype=np.float32)), 422, ["no rows"]),
        (npy(np.zeros((2, 6), dtype=bool)), 422, ["dtype is bool"]),
        (npy(np.full((2, 6), 1e300)), 422, ["out of range for float32"]),
        (npy(np.zeros((51, 6), dtype=np.float32)), 413, ["51 rows are above max_batch_rows 50"]),
        (npy(np.zeros((400, 6))), 413, ["above max_batch_bytes 8192"]),
        # the header is checked against the body before any array is made
        (npy(np.zeros((2, 6), dtype=np.float32))[:-4], 400, ["the body has", "its .npy header declares"]),
        (npy(np.zeros((2, 6), dtype=np.float32)) + b"tail", 400, ["the body has", "its .npy header declares"]),
        (npy(np.zeros((2, 6), dtype=np.float32)).replace(b"(2, 6)", b"(9, 6)"), 400, ["its .npy header declares"]),
    ],
)
def test_a_bad_npy_batch_gets_a_4xx_naming_the_problem_and_the_worker_keeps_serving(
    shared: dict[str, Any], body: bytes, status: int, words: list[str]
) -> None:
    server = shared["server"]
    got, doc, _ = call_npy(server.port, "/v1/models/reg/1/predict/batch", body)
    assert got == status, doc
    for word in words:
        assert word in doc["error"]
    got, doc, _ = call_npy(server.port, "/v1/models/reg/1/predict/batch", npy(np.ones((2, 6), dtype=np.float32)))
    assert got == 200 and len(doc["predictions"]) == 2


def test_npy_in_other_byte_orders_accept_weights_and_routes(shared: dict[str, Any]) -> None:
    server = shared["server"]
    rows = np.linspace(-2, 2, 30, dtype=np.float32).reshape(5, 6)
    want = [same(float(v)) for v in shared["trained"][("reg", "1")].inplace_predict(rows)]
    got, doc, ctype = call_npy(server.port, "/v1/models/reg/1/predict/batch", npy(rows.astype(">f8")))
    assert (got, ctype) == (200, "application/json") and doc["predictions"] == want
    # .npy asked for with a weight of 0: JSON
    got, doc, ctype = call_npy(
        server.port, "/v1/models/reg/1/predict/batch", npy(rows), accept="application/json, application/x-npy;q=0"
    )
    assert (got, ctype) == (200, "application/json")
    got, out, ctype = call_npy(
        server.port, "/v1/models/reg/1/predict/batch", npy(rows), accept="text/html, application/x-npy;q=0.5"
    )
    assert (got, ctype) == (200, "application/x-npy") and out.tolist() == want
    got, doc, _ = call_npy(server.port, "/v1/models/reg/1/predict", npy(rows))
    assert (got, doc) == (415, {"error": "a .npy body goes to /v1/models/reg/1/predict/batch; this route takes one JSON row"})
    # a JSON value beyond float32 is refused as the .npy one is (before: a prediction for inf)
    got, doc, _ = call(server.port, "POST", "/v1/models/reg/1/predict/batch", {"rows": [[1e300] * 6]})
    assert got == 422 and "out of range for float32" in doc["error"], doc


def test_a_stalled_batch_body_gets_408_and_closes_the_connection() -> None:
    """A .npy body holds the worker's one batch turn while it arrives: one that stops arriving is
    answered 408 after its time (here 0.2 s), and marked so the answer closes the connection
    instead of waiting on the rest of the body."""
    import asyncio

    from provisioner.smoke.workloads import serving as serving_workload

    serving_workload._serve_module(str(SERVER))  # puts the server's parts on sys.path, as on a host
    app = sys.modules["provisioner_serve_app"]

    async def stalled() -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {}

    async def run() -> tuple[int, bool]:
        scope = {"headers": [(b"content-length", b"8000"), (b"content-type", b"application/x-npy")]}
        exchange = app.Exchange(scope, stalled)
        with pytest.raises(app.RequestError) as caught:
            await exchange.body(1 << 20, "max_batch_bytes", 0.2)
        return caught.value.status, exchange.stalled

    assert asyncio.run(run()) == (408, True)


def test_a_corrupt_unlisted_version_is_refused_naming_its_file_and_others_keep_serving(shared: dict[str, Any]) -> None:
    server = shared["server"]
    errors_before = server.metric("provisioner_serving_model_loads_total", result="error")
    status, doc, _ = call(server.port, "POST", "/v1/models/broken/1/predict", {"features": row(6, 0)})
    assert status == 500
    assert str(shared["registry"] / "broken" / "1" / "model.ubj") in doc["error"]
    assert server.metric("provisioner_serving_model_loads_total", result="error") == errors_before + 1
    assert server.models()[("broken", "1")]["loaded"] is False
    status, _, _ = call(server.port, "POST", "/v1/models/clf/1/predict", {"features": row(6, 0)})
    assert status == 200


def test_latest_is_the_highest_version_in_numeric_order(shared: dict[str, Any]) -> None:
    server = shared["server"]
    r = row(6, 11)
    status, doc, _ = call(server.port, "POST", "/v1/models/lat/latest/predict", {"features": r})
    assert status == 200, doc
    assert doc == {
        "model": "lat",
        "version": "10",
        "prediction": same(shared["trained"][("lat", "10")].inplace_predict(as_array(r))[0]),
    }
    status, doc, _ = call(server.port, "POST", "/v1/models/lat/latest/predict/batch", {"rows": [r]})
    assert status == 200 and doc["version"] == "10"
    assert server.metric("provisioner_serving_requests_total", model="lat", version="10", code="200") == 2


def test_a_version_added_to_the_registry_is_loaded_on_first_request(shared: dict[str, Any]) -> None:
    server, registry = shared["server"], shared["registry"]
    loads_before = server.metric("provisioner_serving_model_loads_total", result="ok")
    # staged next to the registry, moved in whole (as the role's load step does)
    staging = registry / ".staging"
    booster = xgb_model(staging, "reg", "7", seed=9, trees=30)
    assert ("reg", "7") not in server.models()
    (staging / "reg" / "7").rename(registry / "reg" / "7")
    entry = server.models()[("reg", "7")]
    assert entry["loaded"] is False and entry["listed"] is False and entry["framework"] == "xgboost"
    r = row(6, 12)
    status, doc, _ = call(server.port, "POST", "/v1/models/reg/7/predict", {"features": r})
    assert status == 200, doc
    assert doc["prediction"] == same(booster.inplace_predict(as_array(r))[0])
    entry = server.models()[("reg", "7")]
    assert entry["loaded"] is True and entry["listed"] is False
    assert server.metric("provisioner_serving_model_loads_total", result="ok") == loads_before + 1


# ---------------------------------------------------------------------------------------
# Cache budget, --check


@pytest.fixture(scope="module")
def padded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three versions whose size on disk (a sparse 40 MiB file each) sets their bytes."""
    registry = tmp_path_factory.mktemp("padded") / "models"
    boosters = {}
    for version in ("1", "2", "3"):
        boosters[version] = xgb_model(registry, "e", version, seed=int(version))
        pad(registry / "e" / version)
    return {"registry": registry, "boosters": boosters}


def test_lru_eviction_under_a_small_budget_is_reported(padded: dict[str, Any], tmp_path: Path) -> None:
    registry, boosters = padded["registry"], padded["boosters"]
    budget = int(2.5 * PAD)  # two versions fit, three do not
    config_path = tmp_path / "serving.json"
    config = write_config(config_path, registry, [{"name": "e", "version": "1"}], budget=budget)
    server = Server(config_path, config)
    try:
        server.wait_ready()

        def predict(version: str) -> None:
            r = row(6, int(version))
            status, doc, _ = call(server.port, "POST", f"/v1/models/e/{version}/predict", {"features": r})
            assert status == 200, doc
            assert doc["prediction"] == same(boosters[version].inplace_predict(as_array(r))[0])

        def loaded() -> set[str]:
            return {v for (_, v), m in server.models().items() if m["loaded"]}

        predict("2")
        assert loaded() == {"1", "2"}
        predict("1")  # 1 is now the most recently used
        predict("3")  # over budget: the least recently used (2) goes
        assert loaded() == {"1", "3"}
        assert server.metric("provisioner_serving_cache_evictions_total") == 1
        predict("2")  # a listed version is evicted too when it is the least recently used
        assert loaded() == {"3", "2"}
        _, doc, _ = call(server.admin, "GET", "/v1/models")
        assert doc["cache_bytes"] == sum(m["bytes"] for m in doc["models"] if m["loaded"]) <= budget
        assert all(m["bytes"] >= PAD for m in doc["models"])
        assert {m["version"]: m["listed"] for m in doc["models"]} == {"1": True, "2": False, "3": False}
        assert server.metric("provisioner_serving_cache_evictions_total") == 2
        assert server.metric("provisioner_serving_loaded_versions") == 2
        assert server.metric("provisioner_serving_cache_bytes") == doc["cache_bytes"]
        assert server.metric("provisioner_serving_cache_budget_bytes") == budget
        # The predict-time gauge follows the cache: the evicted version's series is gone.
        timed = {k[1] for k in server.metrics() if k[0] == "provisioner_serving_predict_seconds"}
        assert {dict(labels)["version"] for labels in timed} == {"3", "2"}, timed
        predict("1")  # evicted versions come back on request
        assert loaded() == {"2", "1"}
    finally:
        assert server.stop() == 0, server.output()


def test_check_passes_a_registry_within_the_budget(padded: dict[str, Any], tmp_path: Path) -> None:
    config_path = tmp_path / "serving.json"
    write_config(config_path, padded["registry"], [{"name": "e", "version": "1"}, {"name": "e", "version": "2"}], budget=3 * PAD)
    result = run_check(config_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout.strip())
    assert [(m["name"], m["version"]) for m in doc["models"]] == [("e", "1"), ("e", "2")]
    assert all(m["bytes"] >= PAD for m in doc["models"])
    assert doc["total_bytes"] == sum(m["bytes"] for m in doc["models"])


def test_a_copy_with_its_parts_runs_and_loads_as_a_module_from_anywhere(padded: dict[str, Any], tmp_path: Path) -> None:
    # The server imports its parts (provisioner_serve_*.py) from its own directory: a copy with
    # them runs there even in isolated mode (no script directory on sys.path), and loads as the
    # module provisioner_serve from another directory (the smoke test's in-process predicts).
    copy = tmp_path / "copy"
    copy.mkdir()
    for part in SERVER.parent.glob("provisioner_serve*.py"):
        shutil.copy(part, copy)
    config_path = tmp_path / "serving.json"
    write_config(config_path, padded["registry"], [{"name": "e", "version": "1"}], budget=3 * PAD)
    result = subprocess.run(
        [sys.executable, "-I", str(copy / SERVER.name), "--config", str(config_path), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert [m["name"] for m in json.loads(result.stdout)["models"]] == ["e"]
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('provisioner_serve', sys.argv[1])\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules['provisioner_serve'] = module\n"
        "spec.loader.exec_module(module)\n"
        "model = module.load_model(module.Registry(sys.argv[2]), 'e', '1', 1)\n"
        "print(model.framework, model.n, module.Model.__module__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", code, str(copy / SERVER.name), str(padded["registry"])],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["xgboost", "6", "provisioner_serve_models"]


def test_check_refuses_a_registry_over_the_budget_naming_the_sizes(padded: dict[str, Any], tmp_path: Path) -> None:
    config_path = tmp_path / "serving.json"
    budget = int(2.5 * PAD)
    write_config(config_path, padded["registry"], "all", budget=budget)
    result = run_check(config_path)
    assert result.returncode == 2 and result.stdout == ""
    line = result.stderr.strip()
    assert "\n" not in line
    for version in ("1", "2", "3"):
        assert f"e/{version} 40.0 MiB" in line
    assert f"budget of 100.0 MiB ({budget} bytes)" in line and "more than" in line


@pytest.mark.parametrize("framework", ["xgboost", "lightgbm", "sklearn"])
def test_check_refuses_a_corrupt_model_file_naming_it(framework: str, tmp_path: Path) -> None:
    registry = tmp_path / "models"
    xgb_model(registry, "good", "1")
    file = {"xgboost": "model.ubj", "lightgbm": "model.txt", "sklearn": "model.joblib"}[framework]
    directory = write_version(registry, "bad", "3", framework, file, 6)
    (directory / file).write_bytes(b"\x00garbage\xff" * 10)
    config_path = tmp_path / "serving.json"
    write_config(config_path, registry, "all")
    result = run_check(config_path)
    assert result.returncode == 2 and result.stdout == ""
    line = result.stderr.strip()
    assert "\n" not in line
    assert str(directory / file) in line and framework in line


def test_check_refuses_bad_metadata_and_a_missing_listed_version(tmp_path: Path) -> None:
    registry = tmp_path / "models"
    xgb_model(registry, "good", "1")
    config_path = tmp_path / "serving.json"
    write_config(config_path, registry, [{"name": "good", "version": "2"}])
    result = run_check(config_path)
    assert result.returncode == 2 and "good/2" in result.stderr and "not in the registry" in result.stderr
    directory = write_version(registry, "odd", "1", "xgboost", "../../escape.ubj", 6)
    write_config(config_path, registry, "all")
    result = run_check(config_path)
    assert result.returncode == 2 and str(directory / "metadata.json") in result.stderr and "relative" in result.stderr
    (directory / "metadata.json").write_text(json.dumps({"framework": "onnx", "file": "m", "features": ["a"]}))
    result = run_check(config_path)
    assert result.returncode == 2 and "'onnx'" in result.stderr
    config_path.write_text(json.dumps({"schema": 1}))
    result = run_check(config_path)
    assert result.returncode == 2 and "registry" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    # A file that is not a JSON object: the metadata and the config each named, one line.
    (directory / "metadata.json").write_text("{not json")
    write_config(config_path, registry, "all")
    result = run_check(config_path)
    assert result.returncode == 2 and "the model metadata is not valid JSON" in result.stderr, result.stderr
    config_path.write_text("[1, 2]")
    result = run_check(config_path)
    assert result.returncode == 2 and "the serving config must be a JSON object; the serving role writes it" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def _catboost_model(directory: Path) -> Any:
    import catboost

    x, y = training_data(6, 1)
    model = catboost.CatBoostRegressor(iterations=20, depth=3, verbose=False, thread_count=1).fit(x, y)
    model.save_model(str(directory / "model.cbm"))
    return model


def _torchscript_model(directory: Path) -> Any:
    import torch

    module = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)))
    module.save(str(directory / "model.pt"))
    return module


@pytest.mark.parametrize(
    ("framework", "module", "component", "file"),
    [("catboost", "catboost", "gbdt", "model.cbm"), ("torchscript", "torch", "torch", "model.pt")],
)
def test_catboost_and_torchscript_load_where_installed_and_are_refused_naming_the_component_where_not(
    framework: str, module: str, component: str, file: str, tmp_path: Path
) -> None:
    registry = tmp_path / "models"
    directory = write_version(registry, "m", "1", framework, file, 6)
    config_path = tmp_path / "serving.json"
    write_config(config_path, registry, "all")
    if importlib.util.find_spec(module) is None:
        (directory / file).write_bytes(b"a model this environment cannot read")
        result = run_check(config_path)
        assert result.returncode == 2
        assert f"framework {framework}" in result.stderr and f"mlstack component {component}" in result.stderr
        return
    model = (_catboost_model if framework == "catboost" else _torchscript_model)(directory)
    result = run_check(config_path)
    assert result.returncode == 0, result.stderr
    config = json.loads(config_path.read_text())
    server = Server(config_path, config)
    try:
        server.wait_ready()
        r = row(6, 3)
        status, doc, _ = call(server.port, "POST", "/v1/models/m/1/predict", {"features": r})
        assert status == 200, doc
        if framework == "catboost":
            want = float(model.predict(as_array(r))[0])
        else:
            import torch

            want = float(model(torch.from_numpy(as_array(r)))[0, 0])
        assert doc["prediction"] == pytest.approx(want, rel=1e-6)
    finally:
        assert server.stop() == 0, server.output()


# ---------------------------------------------------------------------------------------
# Two workers on one port, SIGTERM drain


class Load:
    """Client threads sending one predict after another until stopped (bounded: 60 s).

    A thread given a connection keeps it alive (http.client reconnects after a response
    with Connection: close); a thread given None opens a new connection per request.
    """

    def __init__(
        self, port: int, path: str, body: dict[str, Any], want: float, conns: list[http.client.HTTPConnection | None]
    ) -> None:
        self.port, self.path, self.want = port, path, want
        self.body = json.dumps(body).encode()
        self.stop = threading.Event()
        self.marks: list[str] = []
        self.results: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(c,)) for c in conns]
        for t in self.threads:
            t.start()

    def mark(self, name: str) -> None:
        self.marks.append(name)

    def run(self, conn: http.client.HTTPConnection | None) -> None:
        ok, closes, errors = 0, 0, []
        by_mark: dict[str, int] = {}
        deadline = time.monotonic() + 60
        while not self.stop.is_set() and time.monotonic() < deadline:
            c = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            headers = (
                {"Content-Type": "application/json"} if conn else {"Content-Type": "application/json", "Connection": "close"}
            )
            try:
                c.request("POST", self.path, body=self.body, headers=headers)
                response = c.getresponse()
                doc = json.loads(response.read())
                if response.status != 200 or doc.get("prediction") != same(self.want):
                    errors.append(f"{response.status} {doc}")
                else:
                    ok += 1
                    if self.marks:
                        by_mark[self.marks[-1]] = by_mark.get(self.marks[-1], 0) + 1
                if (response.getheader("connection") or "").lower() == "close":
                    closes += 1  # a kept connection reconnects on the next request
            except (OSError, http.client.HTTPException) as exc:
                errors.append(repr(exc))
                c.close()
            if conn is None:
                c.close()
        if conn is not None:
            conn.close()
        with self.lock:
            self.results.append({"ok": ok, "closes": closes, "errors": errors, "by_mark": by_mark})

    def finish(self) -> list[dict[str, Any]]:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        return self.results


def test_two_workers_share_the_port_and_one_drains_under_keep_alive_load_losing_nothing(tmp_path: Path) -> None:
    registry = tmp_path / "models"
    booster = xgb_model(registry, "reg", "1")
    config_path = tmp_path / "serving.json"
    config = write_config(config_path, registry, "all", workers=2)
    servers = [Server(config_path, config, i) for i in range(2)]
    try:
        for s in servers:
            s.wait_ready()
        port = config["port"]
        # keep-alive connections on the shared port, three to each worker (which one: /healthz on it)
        per_worker: dict[int, list[http.client.HTTPConnection]] = {0: [], 1: []}
        for _ in range(200):
            if all(len(c) >= 3 for c in per_worker.values()):
                break
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            status, doc, _ = call(port, "GET", "/healthz", conn=conn)
            assert status == 200
            if len(per_worker[doc["worker"]]) < 3:
                per_worker[doc["worker"]].append(conn)
            else:
                conn.close()
        assert all(len(c) == 3 for c in per_worker.values()), "SO_REUSEPORT spread no connections to one worker"

        r = row(6, 5)
        load = Load(
            port,
            "/v1/models/reg/1/predict",
            {"features": r},
            float(booster.inplace_predict(as_array(r))[0]),
            [c for conns in per_worker.values() for c in conns],
        )
        time.sleep(0.5)
        served_by_0 = servers[0].metric("provisioner_serving_requests_total", model="reg", version="1", code="200")
        servers[0].proc.send_signal(signal.SIGTERM)
        rc = servers[0].proc.wait(timeout=30)
        load.mark("stopped")
        time.sleep(0.5)  # the load goes on against the remaining worker
        results = load.finish()
        assert rc == 0, servers[0].output()
        assert "drained" in servers[0].output()
        assert served_by_0 > 0
        assert [e for res in results for e in res["errors"]] == []
        assert len(results) == 6
        # the three connections on the stopped worker were told to close, and went on elsewhere
        assert sum(res["closes"] for res in results) >= 3
        assert all(res["by_mark"].get("stopped", 0) > 0 for res in results)
        assert servers[1].proc.poll() is None
    finally:
        for s in servers:
            s.stop()


def test_socket_activation_workers_share_the_inherited_socket_and_a_rolling_restart_drops_nothing(tmp_path: Path) -> None:
    registry = tmp_path / "models"
    booster = xgb_model(registry, "reg", "1")
    config_path = tmp_path / "serving.json"
    config = write_config(config_path, registry, "all", workers=2)
    # the socket unit's socket: one accept queue, no SO_REUSEPORT, so a worker binding the
    # port itself would fail; answering proves it serves the inherited one
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    port = listener.getsockname()[1]
    config["port"] = port
    config_path.write_text(json.dumps(config))
    servers = [Server(config_path, config, i, inherit=listener) for i in range(2)]
    load = None
    try:
        for s in servers:
            s.wait_ready()
        seen = {call(port, "GET", "/healthz")[1]["worker"] for _ in range(40)}
        r = row(6, 6)
        # two kept-alive connections and two opening a connection per request
        conns: list[http.client.HTTPConnection | None] = [
            http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(2)
        ]
        load = Load(
            port,
            "/v1/models/reg/1/predict",
            {"features": r},
            float(booster.inplace_predict(as_array(r))[0]),
            [*conns, None, None],
        )
        for index in range(2):  # restart worker by worker, as serve load does
            time.sleep(0.3)
            servers[index].proc.send_signal(signal.SIGTERM)
            assert servers[index].proc.wait(timeout=30) == 0, servers[index].output()
            load.mark(f"stopped {index}")
            servers[index] = Server(config_path, config, index, inherit=listener)
            servers[index].wait_ready()
            load.mark(f"restarted {index}")
        time.sleep(0.3)
        results = load.finish()
        load = None
        assert seen <= {0, 1}
        assert [e for res in results for e in res["errors"]] == []
        assert all(res["ok"] > 0 for res in results)
        # requests went on while each worker was down and after it came back
        for name in ("stopped 0", "restarted 0", "stopped 1", "restarted 1"):
            assert sum(res["by_mark"].get(name, 0) for res in results) > 0, name
        assert all(s.readyz() == 200 for s in servers)
    finally:
        if load is not None:
            load.finish()
        for s in servers:
            s.stop()
        listener.close()


def test_bad_config_and_a_taken_admin_port_are_one_line_and_exit_2(tmp_path: Path) -> None:
    registry = tmp_path / "models"
    registry.mkdir()
    config_path = tmp_path / "serving.json"
    config = write_config(config_path, registry, [])
    result = subprocess.run(
        [sys.executable, str(SERVER), "--config", str(config_path), "--worker", "3"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "worker 3 is not in" in result.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", config["admin_port_base"]))
        taken.listen()
        result = subprocess.run(
            [sys.executable, str(SERVER), "--config", str(config_path), "--worker", "0"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2 and f"127.0.0.1:{config['admin_port_base']}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    bad = dict(config, cache_budget_bytes="lots")
    config_path.write_text(json.dumps(bad))
    result = subprocess.run(
        [sys.executable, str(SERVER), "--config", str(config_path), "--worker", "0"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "cache_budget_bytes" in result.stderr


# ---------------------------------------------------------------------------------------
# A refused body: every client gets the answer and its reason, none a connection reset

BIG = 10 << 20  # ten MiB: far above the shared server's 4096-byte max_body_bytes and the socket buffers


def oversized_body() -> bytes:
    # valid JSON, so only its size is wrong
    return json.dumps({"features": {"f0": 1.0}, "pad": "x" * BIG}).encode()


def read_answer(sock: socket.socket, buffered: bytes = b"") -> tuple[int, dict[str, str], Any, bytes]:
    """One HTTP response off SOCK: status, headers, JSON body, and what came after it."""
    raw = buffered
    while b"\r\n\r\n" not in raw:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed before answering: {raw!r}"
        raw += chunk
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed in the middle of its answer"
        rest += chunk
    return int(lines[0].split()[1]), headers, json.loads(rest[:length]), rest[length:]


@pytest.mark.parametrize(
    ("path", "status", "reason"),
    [
        ("/v1/models/reg/1/predict", 413, "body of {size} bytes is above max_body_bytes 4096"),
        # refused before the body is looked at: the same unread body behind it
        ("/v1/models/nosuch/1/predict", 404, "no model version nosuch/1 in the registry"),
    ],
)
def test_a_refused_big_body_gets_its_answer_with_urllib(shared: dict[str, Any], path: str, status: int, reason: str) -> None:
    """urllib sends no Expect: 100-continue and Connection: close; it writes the whole body
    before it reads a byte (before, the server's close over the unread body reset the
    connection: URLError "Connection reset by peer")."""
    import urllib.error
    import urllib.request

    server = shared["server"]
    body = oversized_body()
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{path}", data=body, headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=60)
    assert caught.value.code == status
    assert json.loads(caught.value.read()) == {"error": reason.format(size=len(body))}


@pytest.mark.parametrize("connection", ["keep-alive", "close"])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_oversized_body_sent_whole_gets_413_and_no_reset(shared: dict[str, Any], framing: str, connection: str) -> None:
    """A raw client: the head and the whole body in one sendall (no Expect), then the answer read
    off the same socket; then a second request on it, or (Connection: close) the server's clean
    end of the connection, not a reset."""
    server = shared["server"]
    body = oversized_body()
    path = "/v1/models/reg/1/predict/batch"
    if framing == "chunked":  # no Content-Length: the server finds out while it reads
        parts = (body[i : i + 65536] for i in range(0, len(body), 65536))
        wire = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"
        framing_header = "Transfer-Encoding: chunked"
        reason = "body above max_body_bytes 4096"
    else:
        wire = body
        framing_header = f"Content-Length: {len(body)}"
        reason = f"body of {len(body)} bytes is above max_body_bytes 4096"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{framing_header}\r\n"
        f"Connection: {connection}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head.encode() + wire)  # ConnectionResetError here, or in recv, is the bug
        status, headers, doc, rest = read_answer(sock)
        assert (status, doc) == (413, {"error": reason})
        if connection == "close":
            assert headers["connection"] == "close"
            assert rest == b"" and sock.recv(65536) == b"", "the server's end of the connection"
            return
        assert headers.get("connection") != "close", "the body was read to its end: the connection is still good"
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, doc, _ = read_answer(sock, rest)
        assert (status, doc) == (200, {"status": "ok", "worker": 0})


def test_an_oversized_body_announced_with_expect_gets_413_before_it_is_sent(shared: dict[str, Any]) -> None:
    """curl's way: the client waits for 100 Continue; the server answers 413 at once instead,
    never asks for the body, and closes (the client may or may not send it)."""
    server = shared["server"]
    head = (
        "POST /v1/models/reg/1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {BIG}\r\nExpect: 100-continue\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head.encode())
        status, headers, doc, rest = read_answer(sock)
        assert (status, doc) == (413, {"error": f"body of {BIG} bytes is above max_body_bytes 4096"})
        assert headers["connection"] == "close" and rest == b"" and sock.recv(1) == b""
