"""The model server over HTTP on this machine, tuned against the naive baseline; prints medians.

    flock /tmp/provisioner-heavy.lock .venv/bin/python benchmarks/serving_http.py [--runs 3] [--duration 5] [--peers]

Trains a 200-tree XGBoost model on 28 features, puts it in a throwaway registry, and drives
with wrk (Debian's package; a POST Lua script, one wrk thread) at 1, 8 and 32 connections:

- tuned: roles/serving/files/provisioner_serve.py as 2 workers x 1 thread, each pinned to
  its CPU, sharing one loopback port with SO_REUSEPORT (what the serving role deploys, bar
  systemd), with its predictor engines (serving_engines [onedal]: oneDAL where the Python
  running the servers has daal4py, chosen at load when equal and faster);
- native: the same with serving_engines [] (run only when an engine was chosen);
- baseline: one uvicorn process with the libraries' default threads (a FastAPI endpoint
  with a pydantic body, run in Starlette's thread pool, XGBoost with its default nthread).
- with --peers: what a user would pick instead, each in a throwaway virtualenv of its own
  (created under --peers-dir on first use, reused after): MLflow's scorer (`mlflow models serve`
  of the same booster saved with mlflow.xgboost, --env-manager local, its default workers) and a
  BentoML service (`bentoml serve`, its defaults) around the same booster; and the bare ASGI
  callable under granian (a Rust HTTP server), to see whether it would move the request path's
  floor.

Prints requests/s, p50/p99 and errors per level (medians over --runs), and the in-process
single-row predict rate (XGBoost's inplace_predict, the server's native predict call and the
engine the server's load chose) and 100,000-row batch rate on one thread: the single-row rate x
cores is what the trees alone would allow. Figures, never pass/fail: the
machine is shared and noisy. --python runs the servers in another environment (the ML venv).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "roles" / "serving" / "files" / "provisioner_serve.py"
LEVELS = (1, 8, 32)
FEATURES = [f"f{i}" for i in range(28)]

TRAIN = """
import json, sys
import numpy as np, xgboost as xgb
out = sys.argv[1]
rng = np.random.default_rng(0)
x = rng.normal(size=(20000, 28)).astype(np.float32)
y = (x[:, 0] * x[:, 1] + np.sin(x[:, 2]) + x[:, 3:8].sum(axis=1) > 0).astype(np.float32)
booster = xgb.train({"objective": "binary:logistic", "max_depth": 6, "eta": 0.1, "nthread": 2}, xgb.DMatrix(x, label=y), 200)
booster.save_model(out + "/model.ubj")
json.dump({"framework": "xgboost", "file": "model.ubj", "features": [f"f{i}" for i in range(28)],
           "task": "classification"}, open(out + "/metadata.json", "w"))
"""

IN_PROCESS = """
import json, os, sys, time
sys.path.insert(0, sys.argv[2])
import numpy as np, xgboost as xgb
import provisioner_serve as ps
booster = xgb.Booster(model_file=sys.argv[1] + "/model.ubj")
booster.set_param({"nthread": 1})
row = np.random.default_rng(1).normal(size=(1, 28)).astype(np.float32)
meta = ps.Metadata("m", "1", ps.Path(sys.argv[1]), json.load(open(sys.argv[1] + "/metadata.json")))
server_predict, _ = ps._load_xgboost(meta, 1)
registry = ps.Registry(os.path.dirname(os.path.dirname(sys.argv[1])))
chosen = ps.load_model(registry, "higgs", "1", 1)
batch = np.random.default_rng(2).normal(size=(100_000, 28)).astype(np.float32)
def rate(f, seconds=2.0):
    for _ in range(200):
        f(row)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(100):
            f(row)
        n += 100
    return n / (time.perf_counter() - start)
def batch_rate(f):
    f(batch[:1000])
    start = time.perf_counter()
    f(batch)
    return len(batch) / (time.perf_counter() - start)
print(json.dumps({"inplace_predict": rate(lambda r: booster.inplace_predict(r)), "server_predict": rate(server_predict),
                  "engine": chosen.engine.name, "engine_reason": chosen.engine.reason, "engine_predict": rate(chosen.predict_fn),
                  "native_batch": batch_rate(server_predict), "engine_batch": batch_rate(chosen.predict_fn)}))
"""

BASELINE_APP = """
import numpy as np
import xgboost as xgb
from fastapi import FastAPI
from pydantic import BaseModel

app = FastAPI()
booster = xgb.Booster(model_file=MODEL)
FEATURES = [f"f{i}" for i in range(28)]


class Row(BaseModel):
    features: dict[str, float]


@app.post("/v1/models/higgs/1/predict")
def predict(row: Row) -> dict:
    x = np.array([[row.features[f] for f in FEATURES]], dtype=np.float32)
    return {"model": "higgs", "version": "1", "prediction": float(booster.inplace_predict(x)[0])}
"""

# The request path's floor: the same load_model and predict path (the engine included) under a
# plain ASGI callable, no routing, validation, middleware or metrics; uvicorn as the server runs it.
RAW_APP = """
import sys
sys.path.insert(0, SERVE_DIR)
import provisioner_serve as ps
from provisioner_serve_app import dumps, loads  # the server's JSON (orjson where installed)

model = ps.load_model(ps.Registry(REGISTRY), "higgs", "1", 1)
HEADERS = [(b"content-type", b"application/json")]


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/readyz":
        out = b"{}"
    else:
        features = loads(body)["features"]
        prediction = model.predict(model.array([model.values(features)]))[0]
        out = dumps({"model": "higgs", "version": "1", "prediction": prediction})
    # With its length (else chunked, and a second write waits on the client's delayed ACK).
    headers = [*HEADERS, (b"content-length", str(len(out)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": out})


if __name__ == "__main__":
    # The inherited listening socket as a TCP socket (uvicorn's --fd takes any fd for a Unix
    # socket, and asyncio then leaves Nagle on: 40 ms a response).
    import socket
    import uvicorn

    config = uvicorn.Config(app, lifespan="off", access_log=False, log_level="warning")
    uvicorn.Server(config).run(sockets=[socket.socket(fileno=int(sys.argv[1]))])
"""

# MLflow's scorer: the same booster saved as an MLflow model (its flavor; the scorer loads it as a pyfunc).
MLFLOW_SAVE = """
import sys
import mlflow.xgboost, xgboost as xgb
booster = xgb.Booster()
booster.load_model(sys.argv[1])
mlflow.xgboost.save_model(booster, sys.argv[2])
"""

# A BentoML service as its docs write one: the booster loaded once, a JSON API taking the row by name.
BENTO_SERVICE = """
import bentoml
import numpy as np
import xgboost as xgb

FEATURES = [f"f{i}" for i in range(28)]


@bentoml.service
class Higgs:
    def __init__(self) -> None:
        self.booster = xgb.Booster()
        self.booster.load_model(MODEL)

    @bentoml.api
    def predict(self, features: dict[str, float]) -> dict:
        x = np.array([[features[f] for f in FEATURES]], dtype=np.float32)
        return {"prediction": float(self.booster.inplace_predict(x)[0])}
"""

LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{body}'
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('RESULT {{"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, ' ..
    '"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.status, e.timeout))
end
"""


def _free_ports():
    """free_ports of the smoke test's serving workload, which starts the same throwaway servers on a host."""
    sys.path.insert(0, str(ROOT))
    from provisioner.smoke.workloads.serving import free_ports

    return free_ports


free_base = _free_ports()


def wait_http(url: str, procs: list[subprocess.Popen[bytes]], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                sys.exit(f"a server exited ({p.returncode}) before it answered {url}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"{url} did not answer in {timeout:.0f}s")


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wrk(url: str, script: Path, connections: int, seconds: int) -> dict[str, float]:
    r = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "5s", "-s", str(script), url],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    if r.returncode != 0 or line is None:
        sys.exit(f"wrk failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
    doc = json.loads(line[len("RESULT ") :])
    errors = doc["connect"] + doc["read"] + doc["write"] + doc["status"] + doc["timeout"]
    return {
        "rps": doc["requests"] / (doc["duration_us"] / 1e6),
        "p50_ms": doc["p50_us"] / 1000,
        "p99_ms": doc["p99_us"] / 1000,
        "errors": errors,
    }


def measure(name: str, url: str, script: Path, runs: int, seconds: int) -> dict[int, dict[str, float]]:
    wrk(url, script, 8, 1)  # warm the connections and caches
    out = {}
    for c in LEVELS:
        samples = [wrk(url, script, c, seconds) for _ in range(runs)]
        out[c] = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
        print(
            f"  {name:9s} c={c:<3d} {out[c]['rps']:8.0f} req/s  p50 {out[c]['p50_ms']:6.2f} ms  "
            f"p99 {out[c]['p99_ms']:6.2f} ms  errors {out[c]['errors']:.0f}",
            flush=True,
        )
    return out


def peer_env(env: Path, packages: list[str]) -> Path:
    """A throwaway virtualenv with PACKAGES (pip's newest), made once and reused."""
    marker = env / ".complete"
    if not marker.exists():
        shutil.rmtree(env, ignore_errors=True)
        print(f"  installing {' '.join(packages)} into {env} (once)", flush=True)
        subprocess.run([shutil.which("python3") or sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run([str(env / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", *packages], check=True)
        marker.write_text(" ".join(packages) + "\n")
    return env


def peer_packages(target: Path, python: str, packages: list[str]) -> Path:
    """PACKAGES installed for PYTHON into a directory of their own (put on PYTHONPATH), made once."""
    marker = target / ".complete"
    if not marker.exists():
        shutil.rmtree(target, ignore_errors=True)
        subprocess.run(
            [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target", str(target), *packages], check=True
        )
        marker.write_text(" ".join(packages) + "\n")
    return target


def post_once(url: str, body: str) -> str:
    request = urllib.request.Request(url, data=body.encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return f"{r.status} {r.read()[:120].decode()}"
    except urllib.error.HTTPError as e:
        sys.exit(f"{url}: {e.code} {e.read()[:300]!r}")


def batches(port: int, path: str, repeats: int, engine_rate: float) -> None:
    """Batch scoring through the server, one request at a time: .npy rows in and .npy predictions out,
    .npy in and JSON out, and JSON rows in (what fits max_body_bytes); medians of REPEATS requests.
    The 100,000-row .npy figure is set against ENGINE_RATE, the served engine's own batch rows/s in
    process: the rest of its time is the body over the socket, the answer and the request path."""
    import http.client
    import io

    import numpy as np

    rng = np.random.default_rng(3)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def post(body: bytes, ctype: str, accept: str) -> float:
        start = time.perf_counter()
        conn.request("POST", path, body=body, headers={"Content-Type": ctype, "Accept": accept})
        response = conn.getresponse()
        payload = response.read()
        if response.status != 200:
            sys.exit(f"batch request: {response.status} {payload[:300]!r}")
        return time.perf_counter() - start

    for n in (1_000, 100_000):
        rows = rng.normal(size=(n, len(FEATURES))).astype(np.float32)
        buffer = io.BytesIO()
        np.save(buffer, rows)
        raw = buffer.getvalue()
        kinds = [("npy -> npy", raw, "application/x-npy", "application/x-npy"), ("npy -> JSON", raw, "application/x-npy", "*/*")]
        if n <= 1_000:
            kinds.append(("JSON -> JSON", json.dumps({"rows": rows.tolist()}).encode(), "application/json", "*/*"))
        for name, body, ctype, accept in kinds:
            post(body, ctype, accept)
            seconds = statistics.median(post(body, ctype, accept) for _ in range(repeats))
            print(
                f"  batch {n:>7,d} rows {name:13s} {n / seconds:>11,.0f} rows/s ({len(body) / 1e6:.1f} MB in, {seconds * 1000:.1f} ms)"
            )
            if n == 100_000 and name == "npy -> npy":
                predict = n / engine_rate
                print(
                    f"    {n / seconds / engine_rate:.2f} of the engine's in-process batch rate: of its {seconds * 1000:.0f} ms, "
                    f"{predict * 1000:.0f} ms predicting, {max(0.0, seconds - predict) * 1000:.0f} ms the body in, the answer out and the request path"
                )
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="wrk runs per level (medians printed)")
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--python", default=sys.executable, help="the Python the servers run in")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--skip-raw", action="store_true", help="no run of the plain ASGI app (the request path's floor)")
    parser.add_argument("--peers", action="store_true", help="also MLflow's scorer, BentoML, and the bare app under granian")
    parser.add_argument(
        "--peers-dir", default="/var/cache/provisioner/bench-peers", help="where --peers keeps its throwaway environments"
    )
    parser.add_argument(
        "--skip-native", action="store_true", help="no second tuned run with serving_engines [] (when an engine was chosen)"
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: apt-get install -y wrk")
    cpus = sorted(os.sched_getaffinity(0))
    top = Path(tempfile.mkdtemp(prefix="pv-serving-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        version = top / "models" / "higgs" / "1"
        version.mkdir(parents=True)
        subprocess.run([args.python, "-c", TRAIN, str(version)], check=True)
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID")}
        one = subprocess.run(
            [args.python, "-c", IN_PROCESS, str(version), str(SERVER.parent)],
            check=True,
            capture_output=True,
            text=True,
            env={**env, "OMP_NUM_THREADS": "1"},
        )
        rates = json.loads(one.stdout)
        body = json.dumps({"features": {f: round(0.1 * (i % 7) - 0.3, 3) for i, f in enumerate(FEATURES)}})
        script = top / "post.lua"
        script.write_text(LUA.format(body=body))
        print(
            f"model: XGBoost, 200 trees (depth 6), 28 features; {len(cpus)} CPUs; wrk -t1, {args.duration}s x {args.runs} per level"
        )
        print(
            f"in-process single-row predict, 1 thread: inplace_predict {rates['inplace_predict']:.0f}/s, "
            f"the server's native predict call {rates['server_predict']:.0f}/s, the engine its load chose "
            f"({rates['engine']}) {rates['engine_predict']:.0f}/s ({rates['engine_predict'] / rates['server_predict']:.1f}x)"
        )
        print(f"  engine choice: {rates['engine_reason']}")
        print(
            f"in-process 100,000-row batch, 1 thread: native {rates['native_batch']:,.0f} rows/s, "
            f"{rates['engine']} {rates['engine_batch']:,.0f} rows/s"
        )

        base = free_base(3)
        config = {
            "schema": 1,
            "registry": str(top / "models"),
            "listen": "127.0.0.1",
            "port": base,
            "admin_port_base": base + 1,
            "workers": [{"index": i, "cpus": [cpus[i % len(cpus)]], "threads": 1} for i in range(2)],
            "cache_budget_bytes": 1 << 30,
            "models": "all",
            "max_body_bytes": 1 << 20,
            "max_batch_rows": 100_000,
            "max_batch_bytes": 64 << 20,
            "warmup_requests": 20,
        }

        def serve(name: str, engines: list[str]) -> dict[int, dict[str, float]]:
            nonlocal procs
            (top / "serving.json").write_text(json.dumps({**config, "engines": engines}))
            procs = [
                subprocess.Popen([args.python, str(SERVER), "--config", str(top / "serving.json"), "--worker", str(i)], env=env)
                for i in range(2)
            ]
            for i in range(2):
                wait_http(f"http://127.0.0.1:{base + 1 + i}/readyz", procs)
            with urllib.request.urlopen(f"http://127.0.0.1:{base + 1}/v1/models", timeout=5) as r:
                served = {m["name"]: m for m in json.load(r)["models"]}["higgs"]
            print(f"  {name}: worker 0 serves higgs/1 through {served['engine']} ({served['predict_us']} µs a row at load)")
            out = measure(name, f"http://127.0.0.1:{base}/v1/models/higgs/1/predict", script, args.runs, args.duration)
            batch_rate = rates["engine_batch"] if served["engine"] != "native" else rates["native_batch"]
            batches(base, "/v1/models/higgs/1/predict/batch", max(args.runs, 5), batch_rate)
            stop(procs)
            return out

        tuned = serve("tuned", ["onedal"])
        native = serve("native", []) if rates["engine"] != "native" and not args.skip_native else None

        def floor() -> dict[int, dict[str, float]]:
            """A bare ASGI app as two uvicorn processes, each pinned to its CPU, on one inherited socket."""
            nonlocal procs
            (top / "rawapp.py").write_text(
                f"SERVE_DIR = {str(SERVER.parent)!r}\nREGISTRY = {str(top / 'models')!r}\n" + textwrap.dedent(RAW_APP)
            )
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", 0))
            listener.listen(2048)
            port = listener.getsockname()[1]
            command = ["rawapp.py", str(listener.fileno())]
            procs = [
                subprocess.Popen(
                    ["taskset", "-c", str(cpus[i % len(cpus)]), args.python, *command],
                    cwd=top,
                    env={**env, "OMP_NUM_THREADS": "1"},
                    pass_fds=(listener.fileno(),),
                )
                for i in range(2)
            ]
            listener.close()
            wait_http(f"http://127.0.0.1:{port}/readyz", procs)
            time.sleep(2)  # both processes loaded (the first to answer is not the only one)
            out = measure("raw ASGI", f"http://127.0.0.1:{port}/v1/models/higgs/1/predict", script, args.runs, args.duration)
            stop(procs)
            return out

        raw = floor() if not args.skip_raw else None

        peers: dict[str, dict[int, dict[str, float]]] = {}
        if args.peers:
            plain = {k: v for k, v in env.items() if not k.endswith("_NUM_THREADS")}
            peers_dir = Path(args.peers_dir)
            # granian for the Python the servers run in, beside its own packages
            extra = peer_packages(peers_dir / "floor", args.python, ["granian"])
            (top / "rawapp.py").write_text(
                f"SERVE_DIR = {str(SERVER.parent)!r}\nREGISTRY = {str(top / 'models')!r}\n" + textwrap.dedent(RAW_APP)
            )
            port = free_base(1)
            procs = [
                subprocess.Popen(
                    [
                        args.python,
                        "-m",
                        "granian",
                        "--interface",
                        "asgi",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--workers",
                        "2",
                        "--log-level",
                        "warning",
                        "rawapp:app",
                    ],
                    cwd=top,
                    env={**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(extra)},
                )
            ]
            wait_http(f"http://127.0.0.1:{port}/readyz", procs)
            time.sleep(2)
            peers["raw granian"] = measure(
                "raw granian", f"http://127.0.0.1:{port}/v1/models/higgs/1/predict", script, args.runs, args.duration
            )
            stop(procs)

            mlflow = peer_env(peers_dir / "mlflow", ["mlflow", "xgboost-cpu"])
            subprocess.run(
                [str(mlflow / "bin" / "python"), "-c", MLFLOW_SAVE, str(version / "model.ubj"), str(top / "mlflow-model")],
                check=True,
                env=plain,
            )
            port = free_base(1)
            procs = [
                subprocess.Popen(
                    [
                        str(mlflow / "bin" / "mlflow"),
                        "models",
                        "serve",
                        "-m",
                        str(top / "mlflow-model"),
                        "--env-manager",
                        "local",
                        "-h",
                        "127.0.0.1",
                        "-p",
                        str(port),
                    ],
                    cwd=top,
                    env={**plain, "PATH": f"{mlflow / 'bin'}:{plain.get('PATH', '/usr/bin:/bin')}"},  # it runs uvicorn by name
                    stderr=(peers_dir / "mlflow.log").open("w"),  # a traceback for each connection wrk closes
                )
            ]
            wait_http(f"http://127.0.0.1:{port}/ping", procs, timeout=300)  # why not: PEERS_DIR/mlflow.log
            values = json.loads(body)["features"]
            mlbody = json.dumps({"dataframe_split": {"columns": FEATURES, "data": [[values[f] for f in FEATURES]]}})
            mlscript = top / "mlflow.lua"
            mlscript.write_text(LUA.format(body=mlbody))
            url = f"http://127.0.0.1:{port}/invocations"
            print(f"  mlflow answers: {post_once(url, mlbody)}")
            peers["mlflow"] = measure("mlflow", url, mlscript, args.runs, args.duration)
            stop(procs)

            bento = peer_env(peers_dir / "bentoml", ["bentoml", "xgboost-cpu"])
            (top / "bento").mkdir()
            (top / "bento" / "service.py").write_text(
                f"MODEL = {str(version / 'model.ubj')!r}\n" + textwrap.dedent(BENTO_SERVICE)
            )
            port = free_base(1)
            procs = [
                subprocess.Popen(
                    [str(bento / "bin" / "bentoml"), "serve", "service:Higgs", "--host", "127.0.0.1", "--port", str(port)],
                    cwd=top / "bento",
                    env={
                        **plain,
                        "BENTOML_DO_NOT_TRACK": "true",
                        "PATH": f"{bento / 'bin'}:{plain.get('PATH', '/usr/bin:/bin')}",
                    },
                    stdout=(peers_dir / "bentoml.log").open("w"),
                    stderr=subprocess.STDOUT,
                )
            ]
            wait_http(f"http://127.0.0.1:{port}/readyz", procs, timeout=300)
            url = f"http://127.0.0.1:{port}/predict"
            print(f"  bentoml answers: {post_once(url, body)}")
            peers["bentoml"] = measure("bentoml", url, script, args.runs, args.duration)
            stop(procs)

        baseline = None
        if not args.skip_baseline:
            (top / "app.py").write_text(f"MODEL = {str(version / 'model.ubj')!r}\n" + textwrap.dedent(BASELINE_APP))
            port = free_base(1)
            plain = {k: v for k, v in env.items() if not k.endswith("_NUM_THREADS")}
            procs = [
                subprocess.Popen(
                    [
                        args.python,
                        "-m",
                        "uvicorn",
                        "app:app",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--log-level",
                        "warning",
                        "--no-access-log",
                    ],
                    cwd=top,
                    env=plain,
                )
            ]
            wait_http(f"http://127.0.0.1:{port}/docs", procs)
            baseline = measure("baseline", f"http://127.0.0.1:{port}/v1/models/higgs/1/predict", script, args.runs, args.duration)
            stop(procs)

        t8 = tuned[8]
        print(
            f"tuned at 8 connections: {t8['rps']:.0f} req/s, p99 {t8['p99_ms']:.2f} ms "
            f"(goal >= 1000 req/s, p99 < 20 ms); {t8['rps'] / (rates['inplace_predict'] * len(cpus)):.2f} of the "
            f"in-process inplace_predict rate x {len(cpus)} cores"
        )
        if native:
            print(f"tuned / tuned with serving_engines [] requests/s at 8 connections: {t8['rps'] / native[8]['rps']:.2f}x")
        if raw:
            print(
                f"tuned / the plain ASGI app on the same predict path at 8 connections: {t8['rps'] / raw[8]['rps']:.2f}x "
                "(what the routes, the checks and the metrics cost)"
            )
        if baseline:
            print(f"tuned / baseline requests/s at 8 connections: {t8['rps'] / baseline[8]['rps']:.2f}x")
        for name, peer in peers.items():
            print(
                f"tuned / {name} requests/s at 1, 8, 32 connections: "
                + ", ".join(f"{tuned[c]['rps'] / peer[c]['rps']:.2f}x" for c in LEVELS)
            )
    finally:
        stop(procs)
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
