"""provisioner's workload smoke test: measure what the ML workloads get from this machine.

    python3 provisioner_smoke-<sha12>.pyz run --python /opt/mlstack/bin/python --user ml [--profile quick|full]
    python3 provisioner_smoke-<sha12>.pyz run --python /var/tmp/venv/bin/python --mode baseline

Runs as root with the system Python and the standard library only. It reads the hardware
(CPU, clock under load, DIMMs), the configuration as the workloads see it (thread settings in
a login shell and in a systemd service, THP, governor, the data mount), and runs each
workload in its own process inside the ML environment:

- tuned mode: as the ML user in a login shell, so the thread settings provisioner installed
  apply exactly as they do for that user; the workloads set their thread counts explicitly
  from the plan, as provisioner advises;
- baseline mode: as root with an empty environment and library defaults, the way a stock
  `pip install` stack runs before any tuning.

Prints one JSON document with the raw figures; the control node holds them against the
hardware's limits. A workload that cannot run (a library not installed) is reported as
skipped with the reason; an error in one does not stop the others.

It runs from the zipapp provisioner.smoke.zipapp builds on the control node; each worker runs a
copy of the same archive (imported from the source tree, as the tests do, it builds one).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import platform
import pwd
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..workloads import BY_NAME, WORKLOADS
from .ml import _data, _missing, median
from .probe import configuration, cpu_busy, cpu_info, memory_devices, read

SCHEMA = 1
PLAN_FILE = "/etc/provisioner/plan.json"
# The plan's values the workloads follow in tuned mode (absent in an older plan: each workload
# then derives its own from the cores, and says so).
WORKLOAD_PLAN_VALUES = (
    "polars_threads",
    "arrow_cpu_threads",
    "joblib_workers",
    "dataloader_workers",
    "dataloader_threads",
    "tf_intra_op_threads",
    "tf_inter_op_threads",
    "feature_matrix_rows",
    "feature_matrix_features",
    "feature_matrix_bytes",
)

# Workload sizes. quick: about 90 s on a 2-core machine; full: the scale of real jobs
# (XGBoost hist on 10M rows, 100 trees, depth 10: the GBM-perf Airline setup). Each workload's
# module holds its own (SIZES, prefixed keys); PROFILES joins them in the registry's order, then
# the timeout of one worker. Until a workload's module holds its SIZES, WORKERS and drive, the
# _LEGACY_ tables here hold them for it.
_LEGACY_SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "serving": {
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
    },
}

TIMEOUT = {"quick": 900, "full": 7200}  # seconds, one worker
PROFILE_NAMES = ("quick", "full")


def _sizes(workload: ModuleType) -> dict[str, dict[str, Any]]:
    return getattr(workload, "SIZES", None) or _LEGACY_SIZES[workload.NAME]


PROFILES: dict[str, dict[str, Any]] = {
    profile: {**{k: v for w in WORKLOADS for k, v in _sizes(w)[profile].items()}, "timeout": TIMEOUT[profile]}
    for profile in PROFILE_NAMES
}


def _only_when_named(workload: ModuleType) -> bool:
    return bool(getattr(workload, "ONLY_WHEN_NAMED", False))


TASKS = tuple(w.NAME for w in WORKLOADS if not _only_when_named(w))
CLUSTER_TASKS = tuple(w.NAME for w in WORKLOADS if _only_when_named(w))
RAY_CONFIG = "/etc/provisioner/ray/ray.json"


# ---------------------------------------------------------------- the clock under load (root, stdlib)


# ---------------------------------------------------------------- parent: run the workers


class Runner:
    def __init__(self, args: argparse.Namespace, script: str, workdir: str, threads: int, trials: int):
        self.args = args
        self.script = script
        self.workdir = workdir
        self.threads = threads
        self.trials = trials
        self.serving_plan: dict[str, Any] | None = None
        self.plan: dict[str, Any] = {}
        self.cpu: dict[str, Any] = {}

    def worker(self, task: str, **extra: Any) -> dict[str, Any]:
        params = {
            "task": task,
            "profile": self.args.profile,
            "mode": self.args.mode,
            "threads": self.threads,
            "trials": self.trials,
            "workdir": self.workdir,
            "plan": {k: self.plan.get(k) for k in WORKLOAD_PLAN_VALUES},
            **extra,
        }
        cmd = [self.args.python, self.script, "worker", json.dumps(params)]
        if self.args.mode == "tuned":
            argv = ["runuser", "-l", self.args.user, "-c", shlex.join(cmd)]
        else:
            argv = ["env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", f"HOME={self.workdir}", "LANG=C.UTF-8", *cmd]
        try:
            r = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=PROFILES[self.args.profile]["timeout"],
                cwd=self.workdir,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return {"error": f"{task}: no result within {PROFILES[self.args.profile]['timeout']} s"}
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            return {"error": f"{task}: exited {r.returncode}: {_why_it_stopped(r.stderr or r.stdout)}"}
        result = json.loads(lines[-1])
        if r.returncode != 0:
            # The measurement is complete; a native library that aborts in the interpreter's teardown
            # (pyarrow's thread pools can) is said beside it, not taken for a failed workload.
            result["exit_after_result"] = f"exited {r.returncode}: {_why_it_stopped(r.stderr)}"
        return result


def _why_it_stopped(output: str) -> str:
    """The lines that say why a worker stopped: its last one, and before a shell's bare "Aborted"
    or "Segmentation fault" the library's own message and the Python line faulthandler named."""
    lines = [ln.strip() for ln in output.strip().splitlines() if ln.strip()]
    if not lines:
        return "no output"
    said = [ln for ln in lines if ln.startswith(("Fatal Python error", "terminate called", "what():"))]
    frames = [ln for ln in lines if ln.startswith("File ")]  # faulthandler's, the innermost first
    # The innermost frame (often a library's) and the innermost of the workload's own code.
    where = frames[:1] + [ln for ln in frames if "/lib/python" not in ln][:1]
    tail = [] if frames and lines[-1] in frames else [lines[-1]]
    return "; ".join(dict.fromkeys([*said, *where, *tail]))


def _terminated(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks: servers stopped, work files removed


ARCHIVE = "provisioner_smoke.pyz"


def running_archive() -> str | None:
    """The zipapp this process runs from, if it runs from one."""
    loader = getattr(sys.modules["__main__"], "__loader__", None)
    archive = getattr(loader, "archive", None)
    return archive if isinstance(archive, str) and os.path.isfile(archive) else None


def worker_archive(dest: str) -> None:
    """The archive the workers run, where the ML user can read it (Ansible's temporary directory is
    root's): a copy of the running one; imported from the source tree (the tests), a fresh build."""
    source = running_archive()
    if source:
        shutil.copyfile(source, dest)
    else:
        from provisioner.smoke import zipapp  # the control node's package: never reached in the archive

        zipapp.build(os.path.dirname(dest), os.path.basename(dest))
    os.chmod(dest, 0o644)


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.time()
    signal.signal(signal.SIGTERM, _terminated)
    plan: dict[str, Any] = {}
    serving_plan: dict[str, Any] | None = None
    if args.mode == "tuned":
        try:
            with open(args.plan, encoding="utf-8") as f:
                plan_doc = json.load(f)
        except (OSError, ValueError) as exc:
            raise SystemExit(f"no plan at {args.plan} ({exc}): run provisioner up first") from None
        plan = plan_doc.get("values", {})
        serving_plan = plan_doc.get("serving")
    cpu = cpu_info()
    threads = int(plan.get("threads_per_job") or cpu["physical_cores"])
    trials = int(plan.get("trials") or cpu["physical_cores"])
    data_dir = args.data_dir if args.data_dir and os.path.ismount(args.data_dir) else "/var/tmp"
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "host": socket.gethostname(),
        "mode": args.mode,
        "profile": args.profile,
        "sizes": PROFILES[args.profile],
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "python": args.python,
        "user": args.user if args.mode == "tuned" else "root (empty environment)",
        "kernel": platform.release(),
        "cpu": cpu,
        "memory": {"total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), **memory_devices()},
        "plan": {
            k: plan.get(k)
            for k in (
                "threads_per_job",
                "trials",
                "threads_per_trial",
                "thp_enabled",
                "thp_defrag",
                "cpu_governor",
                "blas",
                *WORKLOAD_PLAN_VALUES,
            )
        },
        "threads": threads,
        "trials": trials,
        "data_dir": data_dir,
        "data_dir_requested": args.data_dir,
        # Other work on the CPUs lowers every figure: how busy they were just before says whether there was any.
        "cpu_busy_before": cpu_busy(),
        "config": configuration(args.user if args.mode == "tuned" else None, data_dir),
        "results": {},
    }
    workdir = tempfile.mkdtemp(prefix="provisioner-smoke-", dir=data_dir)
    try:
        os.chmod(workdir, 0o755)
        script = os.path.join(workdir, ARCHIVE)
        worker_archive(script)
        if args.mode == "tuned":
            pw = pwd.getpwnam(args.user)
            os.chown(workdir, pw.pw_uid, pw.pw_gid)
        runner = Runner(args, script, workdir, threads, trials)
        runner.serving_plan = serving_plan
        runner.plan = plan
        runner.cpu = cpu
        chosen = (
            []
            if args.config_only
            else ([t for t in TASKS if not args.only or t in args.only] + [t for t in CLUSTER_TASKS if t in (args.only or ())])
        )
        for task in chosen:
            t0 = time.monotonic()
            # A workload's root-parent step where it has one (its module's drive), else its one worker.
            drive = getattr(BY_NAME[task], "drive", None) or _LEGACY_DRIVES.get(task)
            result = drive(runner) if drive else runner.worker(task)
            result["seconds"] = round(time.monotonic() - t0, 2)
            out["results"][task] = result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out["seconds"] = round(time.time() - started, 2)
    return out


# ---------------------------------------------------------------- serving (root: the server and wrk)

SERVING_CONFIG = "/etc/provisioner/serving/serving.json"
SERVING_LEVELS = (1, 8, 32)  # concurrent connections wrk holds open
SERVING_START_S = 120  # a worker loads and warms its models before its admin port says ready
SERVING_STOP_S = 10  # SIGTERM drains for a few seconds; past this the worker is killed
WRK_PACKAGE = "wrk"
POST_LUA = """-- one JSON row per request, the same every time (written by provisioner_smoke.py)
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = {body}
"""
_TIME_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}


def _ms(value: str, unit: str) -> float:
    return float(value) * _TIME_UNITS_MS[unit]


def parse_wrk(text: str) -> dict[str, Any]:
    """wrk --latency output -> requests/s, latency percentiles (ms), requests, socket errors, non-2xx."""
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", text, re.M)
    if not rps:
        tail = text.strip().splitlines()
        raise ValueError(f"wrk printed no Requests/sec line: {tail[-1] if tail else 'no output'}")
    out: dict[str, Any] = {"requests_per_s": float(rps.group(1))}
    for pct, value, unit in re.findall(r"^\s+(\d+(?:\.\d+)?)%\s+([\d.]+)(us|ms|s|m|h)\s*$", text, re.M):
        out[f"p{float(pct):g}_ms"] = _ms(value, unit)
    lat = re.search(r"^\s+Latency\s+([\d.]+)(us|ms|s|m|h)\s+[\d.]+\w+\s+([\d.]+)(us|ms|s|m|h)", text, re.M)
    if lat:
        out["mean_ms"], out["max_ms"] = _ms(lat.group(1), lat.group(2)), _ms(lat.group(3), lat.group(4))
    done = re.search(r"^\s+(\d+) requests in ([\d.]+)(us|ms|s|m|h)", text, re.M)
    if done:
        out["requests"], out["seconds"] = int(done.group(1)), _ms(done.group(2), done.group(3)) / 1000
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    out["socket_errors"] = (
        dict(zip(("connect", "read", "write", "timeout"), map(int, sock.groups()), strict=True)) if sock else {}
    )
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    out["non_2xx"] = int(non2xx.group(1)) if non2xx else 0
    return out


def _http(url: str, body: bytes | None = None, timeout: float = 5.0) -> tuple[int, Any]:
    """(status, JSON body or text) of a GET, or a POST of `body`; status 0 when nothing answers."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    req = urllib.request.Request(url, data=body, headers=headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (OSError, ValueError):
        return 0, None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")[:300]


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


def _row(features: list[str]) -> dict[str, float]:
    rng = random.Random(11)
    return {f: round(rng.gauss(0.0, 1.0), 4) for f in features}


def run_wrk(wrk: str, lua: str, url: str, connections: int, seconds: float) -> dict[str, Any]:
    argv = [wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", lua, url]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"wrk exited {r.returncode}: {(r.stderr or r.stdout).strip()[-200:]}")
    return parse_wrk(r.stdout)


def serving(runner: Runner) -> dict[str, Any]:
    """The model server under HTTP load: the deployed one when it answers (tuned mode), else a
    throwaway one on free loopback ports with a 200-tree XGBoost model, at 1, 8 and 32 connections."""
    wrk = shutil.which("wrk")
    if not wrk:
        return {"skipped": f"wrk is not installed (the Debian package {WRK_PACKAGE}; role common installs it)"}
    args, s = runner.args, PROFILES[runner.args.profile]
    source = args.serve_script
    if not source or not os.path.isfile(source):
        return {
            "error": f"serving: the model server script is missing ({source or 'no --serve-script'}): "
            "the smoke role ships it from roles/serving/files"
        }
    serve = os.path.join(runner.workdir, "provisioner_serve.py")
    shutil.copyfile(source, serve)
    os.chmod(serve, 0o644)
    target, why = deployed_server(args.serving_config) if args.mode == "tuned" else (None, "baseline mode: the naive setup")
    registry = os.path.join(runner.workdir, "registry")
    if target is None:
        os.mkdir(registry)
        if args.mode == "tuned":
            os.chown(registry, *(lambda pw: (pw.pw_uid, pw.pw_gid))(pwd.getpwnam(args.user)))
        features = [f"f{i}" for i in range(28)]
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
    body = json.dumps({"features": _row(features)}, separators=(",", ":"))
    lua = os.path.join(runner.workdir, "post.lua")
    with open(lua, "w", encoding="utf-8") as f:
        f.write(POST_LUA.format(body=json.dumps(body)))
    procs: list[subprocess.Popen] = []
    try:
        if target is None:
            workers, how = serving_workers(args.mode, runner.serving_plan)
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
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": runner.workdir, "LANG": "C.UTF-8"}
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
            url = f"http://127.0.0.1:{port}/v1/models/smoke/1/predict"
            out.update(
                url=url,
                workers=workers,
                workers_how=how,
                ready_s=round(time.monotonic() - t0, 2),
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


# ---------------------------------------------------------------- workers (inside the ML environment)


# What the workloads measure in tuned mode: the code a user writes, in the ML user's login shell,
# with no thread limit a user would not set. The environment (role thread_env, and the ML
# environment's start-up hook for joblib's workers) decides every pool's threads; a workload
# reads what each library took and the checks hold that to the plan. Only the one-core
# reference runs (the per-core rates the limits scale) set a limit of 1, and say so.


# What the model server imports from the ML environment (the mlstack component serving).
SERVING_MODULES = ("starlette", "uvicorn", "prometheus_client")


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

    s = PROFILES[p["profile"]]
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
    row = p["row"]

    def once() -> Any:  # what a predict request does after the JSON body is parsed
        return model.predict(model.array([model.values(row)]))[0]

    for _ in range(50):
        once()
    rates: list[float] = []
    lat_us: list[float] = []
    for _ in range(3):
        lat = []
        t_start = time.perf_counter()
        for _ in range(s["serving_calls"]):
            t0 = time.perf_counter()
            once()
            lat.append(time.perf_counter() - t0)
        rates.append(s["serving_calls"] / (time.perf_counter() - t_start))
        lat_us.extend(v * 1e6 for v in lat)
    arr = np.array(lat_us)
    out["inproc"] = {
        "per_s": median(rates),
        "per_s_each": rates,
        "calls": s["serving_calls"],
        "repeats": 3,
        "threads": 1,
        "p50_us": float(np.percentile(arr, 50)),
        "p99_us": float(np.percentile(arr, 99)),
        "how": "the server's load_model(threads=1), then values -> array -> predict per row, one thread",
    }
    return out


# ---------------------------------------------------------------- workloads of real jobs


# The measuring functions each task names, until the workload's module holds them (its WORKERS).
_LEGACY_WORKERS: dict[str, dict[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "serving": {"serving_model": w_serving_model},
}
WORKERS = {task: fn for w in WORKLOADS for task, fn in (getattr(w, "WORKERS", None) or _LEGACY_WORKERS[w.NAME]).items()}
# The root parent's step of a workload, until its module holds it (its drive).
_LEGACY_DRIVES: dict[str, Callable[[Runner], dict[str, Any]]] = {
    "serving": serving,
}


def worker(params: dict[str, Any]) -> None:
    task = params["task"]
    try:
        if task in ("gemm", "triad", "gbdt") and _missing("numpy", "core"):
            result = _missing("numpy", "core")
        else:
            result = WORKERS[task](params)
    except Exception as exc:  # one failed workload must not hide the others
        result = {"error": f"{task}: {type(exc).__name__}: {exc}"}
    # Out before the interpreter's teardown, where a native library may abort: a script's stdout
    # was flushed before its exit handlers ran, a zipapp's (run by runpy) is not.
    print(json.dumps(result), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure everything (as root), print JSON")
    r.add_argument("--python", required=True, help="the ML environment's python")
    r.add_argument("--user", help="run the workloads as this user in a login shell (tuned mode)")
    r.add_argument("--mode", choices=("tuned", "baseline"), default="tuned")
    r.add_argument("--profile", choices=tuple(PROFILES), default="quick")
    r.add_argument("--data-dir", default=None, help="the data mount; /var/tmp when it is not a mount point")
    r.add_argument("--plan", default=PLAN_FILE)
    r.add_argument("--only", nargs="*", choices=TASKS + CLUSTER_TASKS, help="only these workloads")
    r.add_argument(
        "--config-only",
        action="store_true",
        help="no workload: only the configuration (threads, THP, governor, data mount) and the host's load",
    )
    r.add_argument("--ray-config", default=RAY_CONFIG, help="the Ray node's configuration (role ray), for the cluster run")
    r.add_argument(
        "--serve-script",
        default=None,
        help="the model server (roles/serving/files/provisioner_serve.py): needed when serving runs",
    )
    r.add_argument(
        "--serving-config",
        default=SERVING_CONFIG,
        help="a deployed model server's config; its endpoint is measured when worker 0 is ready",
    )
    w = sub.add_parser("worker", help="one workload inside the ML environment (internal)")
    w.add_argument("params")
    args = parser.parse_args(argv)
    if args.cmd == "worker":
        # A native crash (SIGSEGV, SIGABRT) prints the Python stack it happened under to stderr.
        faulthandler.enable()
        worker(json.loads(args.params))
        # A normal exit, never os._exit: the interpreter's teardown is where joblib's loky stops its
        # worker processes, which otherwise hold this worker's stdout open for their idle timeout.
        return 0
    if args.mode == "tuned" and not args.user:
        parser.error("tuned mode needs --user")
    if not args.config_only and (not args.only or "serving" in args.only) and not args.serve_script:
        parser.error("the serving workload needs --serve-script (roles/serving/files/provisioner_serve.py)")
    print(json.dumps(run(args)))
    return 0
