"""The model server under HTTP load (wrk at 1, 8 and 32 connections): requests/s at 8 against the
in-process predict rate x the physical cores, p99 against what an endpoint can afford, no failed
request at any level; the other levels and the in-process rate reported.

Measured on the target (WORKERS, in the ML environment); judged on the control node, which
reads results.serving: levels [{connections, requests_per_s, p50_ms,
p99_ms, runs, seconds, requests, socket_errors, non_2xx}], inproc {per_s, p50_us, p99_us, how,
repeats, calls, engine, engine_reason, native_per_s}, inproc_error, model, model_name, target,
workers_how; the raw result's cpu.physical_cores. native_per_s is the framework's own rate, measured
when a predictor engine serves: the requests/s limit is then that rate x the cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from ..base import FAIL, INFO, PASS, WARN, Check, Objective, _problem, against_limit, span
from ..target.http import _http, allocator_env, check_loaded, parse_wrk
from ..target.ml import _data, _missing, median
from ..target.probe import core_groups, read

NAME = "serving"
# The plan values whose change moves its figures: what the tuner may search (registry: KNOBS).
KNOBS: tuple[str, ...] = ("serving_threads_per_worker", "serving_workers", "serving_allocator")
# What `provisioner tune` optimises (tune_drive): a throwaway server of the candidate's workers x
# threads and allocator, each worker on its own cores as the plan slices them, under wrk at the
# connections the smoke check holds (SERVING_CONNECTIONS): its requests/s.
TUNE = Objective("requests/s at 8 connections", True, lambda r: float(r["requests_per_s"]))


# ---------------------------------------------------------------- target, ML environment

SIZES: dict[str, dict[str, Any]] = {
    "quick": {
        "serving_rows": 20_000,
        "serving_trees": 200,
        "serving_depth": 6,
        "serving_calls": 2000,
        "serving_seconds": 4,
        "serving_repeats": 1,
    },
    "full": {
        "serving_rows": 200_000,
        "serving_trees": 200,
        "serving_depth": 6,
        "serving_calls": 20_000,
        "serving_seconds": 15,
        "serving_repeats": 3,
    },
}


# What the model server imports from the ML environment (the mlstack component serving).
SERVING_MODULES = ("uvicorn", "prometheus_client")


def _serve_module(path: str):
    """The model server's own code as a module: its registry, loader and predict path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("provisioner_serve", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load the model server from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["provisioner_serve"] = module
    spec.loader.exec_module(module)
    return module


def w_serving_model(p: dict[str, Any]) -> dict[str, Any]:
    """Train the smoke model into the throwaway registry (train: true), then time single-row
    predicts in this process through the model server's own loader and predict path, one thread."""
    for module, component in (("xgboost", "gbdt"), *((m, "serving") for m in SERVING_MODULES)):
        missing = _missing(module, component)
        if missing:
            return missing
    import numpy as np

    s = SIZES[p["profile"]]
    serve = _serve_module(p["serve_script"])
    out: dict[str, Any] = {}
    if p["train"]:
        import xgboost as xgb

        x, y = _data(s["serving_rows"], len(p["features"]), seed=11)
        params: dict[str, Any] = {"tree_method": "hist", "max_depth": s["serving_depth"], "objective": "binary:logistic"}
        t0 = time.perf_counter()
        booster = xgb.train(params, xgb.DMatrix(x, label=y), num_boost_round=s["serving_trees"])
        version_dir = os.path.join(p["registry"], p["name"], p["version"])
        os.makedirs(version_dir)
        booster.save_model(os.path.join(version_dir, "model.ubj"))
        with open(os.path.join(version_dir, "metadata.json"), "w", encoding="utf-8") as f:
            json.dump({"framework": "xgboost", "file": "model.ubj", "features": p["features"], "task": "classification"}, f)
        out["model"] = {
            "framework": "xgboost",
            "library": f"xgboost {xgb.__version__}",
            "trees": s["serving_trees"],
            "depth": s["serving_depth"],
            "features": len(p["features"]),
            "train_rows": s["serving_rows"],
            "train_s": round(time.perf_counter() - t0, 2),
        }
    model = serve.load_model(serve.Registry(p["registry"]), p["name"], p["version"], 1)
    out.setdefault("model", {"framework": model.framework, "features": model.n})
    out["model"]["bytes"] = model.bytes
    if not p.get("inproc", True):  # tune's: the model only, the in-process rate is the smoke test's
        return out
    row = p["row"]
    out["inproc"] = _inproc_rate(model, row, s["serving_calls"], np)
    engine = getattr(model, "engine", None)  # the predictor engine its load chose (docs/serving.md)
    if engine is not None:
        out["inproc"].update(engine=engine.name, engine_reason=engine.reason)
        if engine.name != "native":
            # The framework's own path too: the HTTP figure is held against it (serving_checks).
            native = serve.load_model(serve.Registry(p["registry"]), p["name"], p["version"], 1, [])
            out["inproc"]["native_per_s"] = _inproc_rate(native, row, s["serving_calls"], np)["per_s"]
    return out


def _inproc_rate(model: Any, row: dict[str, Any], calls: int, np: Any) -> dict[str, Any]:
    """MODEL's single-row rate in this process: what a predict request does after the JSON body is
    parsed (values -> array -> predict), 3 x CALLS calls after 50 to warm, one thread."""

    def once() -> Any:
        return model.predict(model.array([model.values(row)]))[0]

    for _ in range(50):
        once()
    rates: list[float] = []
    lat_us: list[float] = []
    for _ in range(3):
        lat = []
        t_start = time.perf_counter()
        for _ in range(calls):
            t0 = time.perf_counter()
            once()
            lat.append(time.perf_counter() - t0)
        rates.append(calls / (time.perf_counter() - t_start))
        lat_us.extend(v * 1e6 for v in lat)
    arr = np.array(lat_us)
    return {
        "per_s": median(rates),
        "per_s_each": rates,
        "calls": calls,
        "repeats": 3,
        "threads": 1,
        "p50_us": float(np.percentile(arr, 50)),
        "p99_us": float(np.percentile(arr, 99)),
        "how": "the server's load_model(threads=1), then values -> array -> predict per row, one thread",
    }


WORKERS = {"serving_model": w_serving_model}


# ---------------------------------------------------------------- target, root parent (stdlib)


SERVING_LEVELS = (1, 8, 32)  # concurrent connections wrk holds open
SERVING_START_S = 120  # a worker loads and warms its models before its admin port says ready
SERVING_STOP_S = 10  # SIGTERM drains for a few seconds; past this the worker is killed
WRK_PACKAGE = "wrk"
POST_LUA = """-- one JSON row per request, the same every time (written by provisioner_smoke.py)
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = {body}
"""


def deployed_server(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """The deployed model server when its config exists and worker 0 says ready: (target, None);
    else (None, why the throwaway server is measured instead)."""
    if not os.path.isfile(path):
        return None, f"no deployed model server ({path} does not exist)"
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        admin = int(config["admin_port_base"])
        host, port, registry = str(config["listen"]), int(config["port"]), str(config["registry"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"the deployed model server's config {path} cannot be read ({exc})"
    status, _ = _http(f"http://127.0.0.1:{admin}/readyz", timeout=2)
    if status != 200:
        return None, f"the deployed model server's worker 0 is not ready on 127.0.0.1:{admin} (status {status or 'none'})"
    status, doc = _http(f"http://127.0.0.1:{admin}/v1/models", timeout=5)
    loaded = [m for m in (doc or {}).get("models", []) if m.get("loaded")] if status == 200 and isinstance(doc, dict) else []
    if not loaded:
        return None, f"the deployed model server on 127.0.0.1:{admin} lists no loaded model version"
    model = loaded[0]
    try:
        with open(os.path.join(registry, model["name"], model["version"], "metadata.json"), encoding="utf-8") as f:
            features = json.load(f)["features"]
    except (OSError, ValueError, KeyError) as exc:
        return None, f"the metadata of the deployed {model['name']}/{model['version']} cannot be read ({exc})"
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    where = f"[{host}]" if ":" in host else host
    return {
        "target": "deployed",
        "config": path,
        "registry": registry,
        "name": model["name"],
        "version": model["version"],
        "framework": model.get("framework"),
        "features": features,
        "url": f"http://{where}:{port}/v1/models/{model['name']}/{model['version']}/predict",
        "workers": config.get("workers", []),
    }, None


def free_ports(count: int) -> int:
    """The first of `count` consecutive loopback ports that are all free now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count > 65535:
            continue
        held = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError(f"no {count} consecutive free loopback ports")


def serving_workers(mode: str, plan: dict[str, Any] | None) -> tuple[list[dict[str, Any]], str]:
    """The throwaway server's workers and how they were chosen.

    tuned: the plan's serving section, one worker per slice with its threads. baseline: the
    naive setup, one process on every CPU with the libraries' default thread count (OpenMP's
    default is one thread per CPU the process may use; the server takes a number, so it gets
    that number, which is what it would pick by itself) and no affinity of its own.
    """
    if mode == "tuned":
        if not plan or not plan.get("worker_cpus"):
            raise RuntimeError("the plan has no serving section (workers, worker_cpus): run provisioner up again")
        threads = int(plan["threads_per_worker"])
        cpus = plan["worker_cpus"]
        return (
            [{"index": i, "cpus": list(c), "threads": threads} for i, c in enumerate(cpus[: int(plan["workers"])])],
            f"the plan: {plan['workers']} workers x {threads} thread(s), each on its own CPUs",
        )
    allowed = sorted(os.sched_getaffinity(0))
    return (
        [{"index": 0, "cpus": allowed, "threads": len(allowed)}],
        f"naive: one worker, the libraries' default {len(allowed)} threads (one per CPU), no affinity of its own",
    )


def _stop(procs: list[subprocess.Popen]) -> list[dict[str, Any]]:
    """SIGTERM every worker (it drains), then make sure: SIGKILL what is left of each process group."""
    out = []
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + SERVING_STOP_S
    for i, p in enumerate(procs):
        how = "SIGTERM"
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            how = "SIGKILL"
            p.kill()
            p.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)  # anything the worker started in its session
        out.append({"worker": i, "stopped_by": how, "exit": p.returncode})
    return out


def _wait_ready(procs: list[subprocess.Popen], admin: int, logs: list[str]) -> None:
    deadline = time.monotonic() + SERVING_START_S
    pending = set(range(len(procs)))
    while pending:
        for i in sorted(pending):
            if procs[i].poll() is not None:
                tail = (read(logs[i], "") or "").strip().splitlines()
                raise RuntimeError(f"model server worker {i} exited {procs[i].returncode}: {tail[-1] if tail else 'no output'}")
            if _http(f"http://127.0.0.1:{admin + i}/readyz", timeout=1)[0] == 200:
                pending.discard(i)
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"model server worker(s) {sorted(pending)} not ready within {SERVING_START_S} s")
        time.sleep(0.1)


SMOKE_FEATURES = tuple(f"f{i}" for i in range(28))  # the throwaway server's model's


def write_post(workdir: str, features: list[str]) -> tuple[str, str]:
    """wrk's script posting one JSON row of FEATURES (post.lua in WORKDIR): its path, and the body."""
    body = json.dumps({"features": _row(features)}, separators=(",", ":"))
    lua = os.path.join(workdir, "post.lua")
    with open(lua, "w", encoding="utf-8") as f:
        f.write(POST_LUA.format(body=json.dumps(body)))
    return lua, body


def _row(features: list[str]) -> dict[str, float]:
    rng = random.Random(11)
    return {f: round(rng.gauss(0.0, 1.0), 4) for f in features}


def run_wrk(wrk: str, lua: str, url: str, connections: int, seconds: float) -> dict[str, Any]:
    argv = [wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", lua, url]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"wrk exited {r.returncode}: {(r.stderr or r.stdout).strip()[-200:]}")
    return parse_wrk(r.stdout)


def ship_server(source: str, workdir: str) -> str:
    """Copy the model server and its parts (provisioner_serve_*.py beside it, which it imports from
    its own directory) into the work directory, readable by the ML user; the server's path there."""
    here = os.path.dirname(os.path.abspath(source))
    parts = sorted(n for n in os.listdir(here) if n.startswith("provisioner_serve_") and n.endswith(".py"))
    for src, name in [(source, "provisioner_serve.py"), *((os.path.join(here, n), n) for n in parts)]:
        dest = os.path.join(workdir, name)
        shutil.copyfile(src, dest)
        os.chmod(dest, 0o644)
    return os.path.join(workdir, "provisioner_serve.py")


def _start_throwaway(
    runner: Any, serve: str, registry: str, workers: list[dict[str, Any]], procs: list[subprocess.Popen], allocator: str | None
) -> tuple[str, float]:
    """Start a throwaway model server of WORKERS with ALLOCATOR (allocator_env) on free loopback ports serving REGISTRY's smoke
    model (as the ML user in tuned mode), each process into PROCS as it starts (the caller stops them); its URL and seconds
    until ready."""
    args = runner.args
    port, admin = free_ports(1), free_ports(len(workers))
    config = {
        "schema": 1,
        "registry": registry,
        "listen": "127.0.0.1",
        "port": port,
        "admin_port_base": admin,
        "workers": workers,
        "cache_budget_bytes": 1 << 30,
        "models": [{"name": "smoke", "version": "1"}],
        "max_body_bytes": 1 << 20,
        "max_batch_rows": 10000,
        "warmup_requests": 20,
    }
    cfg = os.path.join(runner.workdir, "serving.json")
    with open(cfg, "w", encoding="utf-8") as f:
        json.dump(config, f)
    os.chmod(cfg, 0o644)
    preload = allocator_env(allocator)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": runner.workdir, "LANG": "C.UTF-8", **preload}
    ids: dict[str, Any] = {}
    if args.mode == "tuned":
        pw = pwd.getpwnam(args.user)
        ids = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
    logs = [os.path.join(runner.workdir, f"serve-{w['index']}.log") for w in workers]
    for w, log in zip(workers, logs, strict=True):
        with open(log, "w", encoding="utf-8") as err:
            procs.append(
                subprocess.Popen(
                    [args.python, serve, "--config", cfg, "--worker", str(w["index"])],
                    env=env,
                    cwd=runner.workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    start_new_session=True,
                    **ids,
                )
            )
    t0 = time.monotonic()
    _wait_ready(procs, admin, logs)
    check_loaded([p.pid for p in procs], preload)
    return f"http://127.0.0.1:{port}/v1/models/smoke/1/predict", round(time.monotonic() - t0, 2)


def drive(runner: Any) -> dict[str, Any]:
    """The model server under HTTP load: the deployed one when it answers (tuned mode), else a
    throwaway one on free loopback ports with a 200-tree XGBoost model, at 1, 8 and 32 connections."""
    wrk = shutil.which("wrk")
    if not wrk:
        return {"skipped": f"wrk is not installed (the Debian package {WRK_PACKAGE}; role common installs it)"}
    args, s = runner.args, SIZES[runner.args.profile]
    source = args.serve_script
    if not source or not os.path.isfile(source):
        return {
            "error": f"serving: the model server script is missing ({source or 'no --serve-script'}): "
            "the smoke role ships it from roles/serving/files"
        }
    serve = ship_server(source, runner.workdir)
    target, why = deployed_server(args.serving_config) if args.mode == "tuned" else (None, "baseline mode: the naive setup")
    registry = os.path.join(runner.workdir, "registry")
    if target is None:
        os.mkdir(registry)
        if args.mode == "tuned":
            os.chown(registry, *(lambda pw: (pw.pw_uid, pw.pw_gid))(pwd.getpwnam(args.user)))
        features = list(SMOKE_FEATURES)
        model = runner.worker(
            "serving_model",
            serve_script=serve,
            registry=registry,
            name="smoke",
            version="1",
            features=features,
            row=_row(features),
            train=True,
        )
    else:
        features = target["features"]
        model = runner.worker(
            "serving_model",
            serve_script=serve,
            registry=target["registry"],
            name=target["name"],
            version=target["version"],
            features=features,
            row=_row(features),
            train=False,
        )
    if "error" in model or "skipped" in model:
        if target is None or "skipped" in model:
            return model
        model = {"inproc": None, "inproc_error": model["error"]}  # the endpoint is still measured
    out: dict[str, Any] = {
        "target": "throwaway" if target is None else "deployed",
        "why_target": why,
        **model,
        "levels": [],
        "wrk": "wrk -t1 --latency, a POST of one JSON row (post.lua)",
    }
    version = subprocess.run([wrk, "--version"], capture_output=True, text=True, check=False)
    out["wrk_version"] = (
        (version.stdout or version.stderr).strip().splitlines()[0] if (version.stdout or version.stderr) else None
    )
    lua, body = write_post(runner.workdir, features)
    procs: list[subprocess.Popen] = []
    try:
        if target is None:
            workers, how = serving_workers(args.mode, runner.serving_plan)
            allocator = (runner.serving_plan or {}).get("allocator") if args.mode == "tuned" else None
            how += "; jemalloc preloaded" if allocator == "jemalloc" else ""
            url, ready_s = _start_throwaway(runner, serve, registry, workers, procs, allocator)
            out.update(
                url=url,
                workers=workers,
                workers_how=how,
                ready_s=ready_s,
                run_as=args.user if args.mode == "tuned" else "root",
            )
        else:
            url = target["url"]
            out.update(
                url=url,
                workers=target["workers"],
                workers_how=f"deployed ({target['config']})",
                model_name=f"{target['name']}/{target['version']}",
                framework=target["framework"],
            )
        status, answer = _http(url, body.encode())
        if status != 200 or not isinstance(answer, dict) or "prediction" not in answer:
            raise RuntimeError(f"a predict request to {url} answered {status or 'nothing'}: {str(answer)[:200]}")
        out["prediction"] = answer["prediction"]
        run_wrk(wrk, lua, url, 8, 1)  # warm the connections and the workers' first requests; not kept
        for connections in SERVING_LEVELS:
            runs = [run_wrk(wrk, lua, url, connections, s["serving_seconds"]) for _ in range(s["serving_repeats"])]
            level: dict[str, Any] = {"connections": connections, "seconds": s["serving_seconds"], "runs": runs}
            for key in ("requests_per_s", "p50_ms", "p90_ms", "p99_ms"):
                values = [r[key] for r in runs if key in r]
                level[key] = median(values) if values else None
            level["socket_errors"] = sum(sum(r["socket_errors"].values()) for r in runs)
            level["non_2xx"] = sum(r["non_2xx"] for r in runs)
            level["requests"] = sum(r.get("requests", 0) for r in runs)
            out["levels"].append(level)
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
        out["error"] = f"serving: {exc}"
    finally:
        if procs:
            out["stopped"] = _stop(procs)
    return out


def tune_workers(values: dict[str, Any], groups: list[list[int]]) -> tuple[list[dict[str, Any]], str]:
    """A tune measurement's workers: VALUES' serving_workers x serving_threads_per_worker (provisioner.tune.knobs.planned),
    sliced as the plan slices them: worker i on cores i x threads onwards with their SMT siblings; on every core when they
    would not fit (plan_allow_oversubscription)."""
    cores = len(groups)
    workers, threads = int(values["serving_workers"]), int(values["serving_threads_per_worker"])
    fit = workers * threads <= cores
    every = sorted(c for group in groups for c in group)
    slices = [sorted(c for g in groups[i * threads : (i + 1) * threads] for c in g) if fit else every for i in range(workers)]
    how = f"{workers} workers x {threads} thread(s), each on {'its own cores' if fit else f'all {cores} cores'}"
    return [{"index": i, "cpus": c, "threads": threads} for i, c in enumerate(slices)], how


def tune_prepare(runner: Any) -> dict[str, Any]:
    """What tune's measurements of the model server share, made once per run before any is timed: the server
    shipped into the work directory, the smoke model trained into a registry there (as the ML user), wrk's
    script; {} when ready, else why not ("skipped"/"error")."""
    wrk = shutil.which("wrk")
    if not wrk:
        return {"skipped": f"wrk is not installed (the Debian package {WRK_PACKAGE}; role common installs it)"}
    args = runner.args
    source = getattr(args, "serve_script", None)
    if not source or not os.path.isfile(source):
        return {"error": f"serving: the model server script is missing ({source or 'no --serve-script'})"}
    features = list(SMOKE_FEATURES)
    try:
        serve = ship_server(source, runner.workdir)
        registry = tempfile.mkdtemp(prefix="registry-", dir=runner.workdir)
        os.chmod(registry, 0o755)
        pw = pwd.getpwnam(args.user)
        os.chown(registry, pw.pw_uid, pw.pw_gid)
        lua, _ = write_post(runner.workdir, features)
    except (OSError, KeyError) as exc:
        return {"error": f"serving: {exc}"}
    model = runner.worker(
        "serving_model", serve_script=serve, registry=registry, name="smoke", version="1",
        features=features, row=_row(features), train=True, inproc=False,
    )  # fmt: skip
    if "error" in model or "skipped" in model:
        return model
    runner.tune_state[NAME] = {"wrk": wrk, "serve": serve, "registry": registry, "lua": lua}
    return {}


def tune_drive(runner: Any, values: dict[str, Any], _env: Any = None) -> dict[str, Any]:
    """One tune measurement: a throwaway server shaped by VALUES (tune_workers: the candidate's variables,
    the third argument, reach it through them) under wrk at SERVING_CONNECTIONS
    for the quick size's seconds after 1 s to warm (tune_prepare made what it serves); the deployed one is untouched."""
    state = runner.tune_state.get(NAME)
    if state is None:  # the driver prepares a workload before its first pair
        return {"error": "serving: nothing prepared for the measurement (tune_prepare did not succeed)"}
    s = SIZES[runner.args.profile]
    workers, how = tune_workers(values, core_groups())
    allocator = values.get("serving_allocator")
    how += "; jemalloc preloaded" if allocator == "jemalloc" else ""
    procs: list[subprocess.Popen] = []
    try:
        url, ready_s = _start_throwaway(runner, state["serve"], state["registry"], workers, procs, allocator)
        run_wrk(state["wrk"], state["lua"], url, SERVING_CONNECTIONS, 1)  # warm; not kept
        r = run_wrk(state["wrk"], state["lua"], url, SERVING_CONNECTIONS, s["serving_seconds"])
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return {"error": f"serving: {exc}"}
    finally:
        # Every server stopped, even when the signal that ends the run arrives meanwhile.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
        try:
            _stop(procs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    failed = sum(r["socket_errors"].values()) + int(r["non_2xx"])
    if failed or not r.get("requests_per_s"):
        return {"error": f"serving: {failed:,} failed requests at {SERVING_CONNECTIONS} connections ({how})"}
    figures = {"requests_per_s": r["requests_per_s"], "p99_ms": r.get("p99_ms"), "ready_s": ready_s}
    return {**figures, "workers": len(workers), "threads": workers[0]["threads"], "workers_how": how, "allocator": allocator}


# ---------------------------------------------------------------- control node

# The model server at SERVING_CONNECTIONS concurrent connections: requests/s against the
# in-process predict rate x the physical cores (pass, warn); p99 in ms (pass within, warn within).
SERVING_CONNECTIONS = 8
SERVING_GRADES = (0.2, 0.08)
SERVING_P99_MS = (20.0, 50.0)


def serving_level(serving: dict[str, Any], connections: int = SERVING_CONNECTIONS) -> dict[str, Any] | None:
    """The wrk figures of the model server at `connections` concurrent connections, if measured."""
    return next((lv for lv in serving.get("levels") or [] if lv.get("connections") == connections), None)


def serving_curve(serving: dict[str, Any]) -> list[dict[str, Any]]:
    """Latency against load: one point per connection level, fewest connections first."""
    points = [
        {k: lv.get(k) for k in ("connections", "requests_per_s", "p50_ms", "p99_ms")}
        for lv in serving.get("levels") or []
        if lv.get("p50_ms") is not None and lv.get("p99_ms") is not None
    ]
    return sorted(points, key=lambda p: p["connections"])


def _failed_requests(serving: dict[str, Any]) -> list[str]:
    """Per level with any, its socket errors and non-2xx responses, as people read them."""
    out = []
    for lv in serving.get("levels") or []:
        errors, non2xx = int(lv.get("socket_errors") or 0), int(lv.get("non_2xx") or 0)
        if errors or non2xx:
            out.append(f"{lv.get('connections')} connections: {errors:,} socket errors, {non2xx:,} non-2xx")
    return out


def serving_checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    """The model server under wrk: requests/s and p99 at 8 connections, failed requests at every level,
    the other levels and the in-process rate reported."""
    title = "model server requests/s"
    problem = _problem("serving.rps", "serving", title, result)
    if problem:
        return [problem]
    level = serving_level(result)
    if level is None or level.get("requests_per_s") is None:
        return [Check("serving.rps", "serving", title, FAIL, f"no figures at {SERVING_CONNECTIONS} connections")]
    model = result.get("model") or {}
    target = result.get("target", "throwaway")
    what = (
        f"{target} server, {result.get('workers_how')}; "
        f"{result.get('model_name') or 'smoke/1'} {model.get('framework', '')} "
        + (f"{model.get('trees')} trees depth {model.get('depth')}, " if model.get("trees") else "")
        + f"{model.get('features')} features"
    )
    runs = len(level.get("runs") or [1])
    detail = f"{what}; wrk -t1, {level.get('seconds')} s x {runs} per level, one JSON row per POST"
    short = f"{target} server, wrk at {SERVING_CONNECTIONS} connections"
    failed = _failed_requests(result)
    cores = int(raw.get("cpu", {}).get("physical_cores") or 1)
    inproc = (result.get("inproc") or {}).get("per_s")
    # With a predictor engine serving, the limit is the framework's own in-process rate: the engine
    # makes the trees so fast that HTTP and JSON bound the server, and the check is about those.
    native = (result.get("inproc") or {}).get("native_per_s")
    engine = (result.get("inproc") or {}).get("engine")
    rps = float(level["requests_per_s"])
    p50 = level.get("p50_ms")
    out = []
    if inproc:
        limit = (native or inproc) * cores
        ratio = rps / limit
        reason = (
            f"{ratio:.0%} of the in-process rate x {cores} cores (the HTTP layer and the load generator on the same "
            f"cores take the rest); p50 {p50:.2f} ms"
        )
        status, reason = against_limit(
            ratio,
            SERVING_GRADES,
            reason,
            "the in-process rate",
            "too few workers, threads fighting over the cores, or a worker off its CPU slice",
        )
        basis = (
            f"the in-process predict rate through the server's loader and predict path ({inproc:,.0f}/s, one thread) "
            f"x {cores} physical cores"
        )
        if native:
            basis = (
                f"the in-process predict rate through the server's loader and the framework's own predict "
                f"({native:,.0f}/s, one thread; {engine} predicts at {inproc:,.0f}/s, so HTTP and JSON bound the "
                f"server) x {cores} physical cores"
            )
        rps_check = Check("serving.rps", "serving", title, status, reason, rps, "requests/s", limit, basis, ratio, detail=detail)
    else:
        why = result.get("inproc_error") or "the in-process rate was not measured"
        rps_check = Check(
            "serving.rps", "serving", title, INFO, f"reported without a limit: {why}", rps, "requests/s", detail=detail
        )
    if failed:
        rps_check.status = FAIL
        rps_check.reason = f"failed requests under load ({'; '.join(failed)}); " + rps_check.reason
    out.append(rps_check)
    ok, warn = SERVING_P99_MS
    p99 = level.get("p99_ms")
    if p99 is not None:
        status = PASS if p99 <= ok else WARN if p99 <= warn else FAIL
        out.append(
            Check(
                "serving.p99",
                "serving",
                f"model server p99 at {SERVING_CONNECTIONS} connections",
                status,
                f"p99 {p99:.2f} ms ({p99 / ok:.0%} of the budget)"
                + ("" if status == PASS else "; requests queue behind busy workers: more workers, or fewer threads each"),
                p99,
                "ms",
                ok,
                f"an endpoint answers in 1-20 ms: p99 within {ok:.0f} ms passes, within {warn:.0f} ms warns",
                p99 / ok,
                higher_is_better=False,
                detail=short,
            )
        )
    total = sum(int(lv.get("requests") or 0) for lv in result.get("levels") or [])
    bad = sum(int(lv.get("socket_errors") or 0) + int(lv.get("non_2xx") or 0) for lv in result.get("levels") or [])
    out.append(
        Check(
            "serving.errors",
            "serving",
            "model server failed requests",
            FAIL if failed else PASS,
            "; ".join(failed)
            if failed
            else f"none of {total:,} requests at {', '.join(str(lv.get('connections')) for lv in result.get('levels') or [])} connections",
            float(bad),
            "requests",
            basis="every request at every level answered 2xx",
            higher_is_better=False,
            detail=f"{target} server, wrk socket errors and non-2xx responses",
        )
    )
    for lv in result.get("levels") or []:
        c = lv.get("connections")
        if c == SERVING_CONNECTIONS or lv.get("requests_per_s") is None:
            continue
        out.append(
            Check(
                f"serving.rps_c{c}",
                "serving",
                f"model server requests/s at {c} connection{'s' if c != 1 else ''}",
                INFO,
                f"p50 {lv.get('p50_ms') or 0:.2f} ms, p99 {lv.get('p99_ms') or 0:.2f} ms",
                float(lv["requests_per_s"]),
                "requests/s",
                detail=f"{target} server, wrk at {c} connection{'s' if c != 1 else ''}",
            )
        )
    if inproc:
        ip = result["inproc"]
        out.append(
            Check(
                "serving.inproc",
                "serving",
                "in-process predict rate (one thread)",
                INFO,
                f"p50 {ip.get('p50_us', 0):,.0f} µs, p99 {ip.get('p99_us', 0):,.0f} µs per row"
                + (f", predicted by {ip['engine']} ({ip.get('engine_reason')})" if ip.get("engine") else ""),
                float(inproc),
                "predicts/s",
                detail=f"{ip.get('how')}; median of {ip.get('repeats')} x {ip.get('calls')} calls",
            )
        )
    return out


checks = serving_checks


def spreads(serving: dict[str, Any]) -> dict[str, list[float] | None]:
    """Requests/s and p99 of each wrk run at SERVING_CONNECTIONS."""
    level = serving_level(serving)
    out: dict[str, list[float] | None] = {}
    for key, cid in (("requests_per_s", "serving.rps"), ("p99_ms", "serving.p99")):
        values = [r[key] for r in (level or {}).get("runs", []) if r.get(key) is not None]
        out[cid] = span(values)
    return out
