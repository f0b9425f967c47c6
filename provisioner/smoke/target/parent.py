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
import faulthandler
import hashlib
import json
import os
import platform
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from ..workloads import BY_NAME, CLUSTER_TASKS, PROFILES, TASKS, WORKERS
from .ml import _missing
from .probe import configuration, cpu_busy, cpu_info, data_mount, memory_devices

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

RAY_CONFIG = "/etc/provisioner/ray/ray.json"


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
        self.code = ""  # the archive tune runs from (its studies are kept per code)
        self.tune_state: dict[str, Any] = {}  # what a workload's tune_drive prepares once per run

    def worker(self, task: str, env: dict[str, str | None] | None = None, **extra: Any) -> dict[str, Any]:
        """One workload in its own process; ENV (variable -> value, None: unset) on top of what the
        ML user's login shell gives it (tune's candidates)."""
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
        if env:
            unset = [a for name, value in sorted(env.items()) if value is None for a in ("-u", name)]
            cmd = ["env", *unset, *(f"{name}={value}" for name, value in sorted(env.items()) if value is not None), *cmd]
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
    data_dir = _data_dir(args)
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
            drive = getattr(BY_NAME[task], "drive", None)
            result = drive(runner) if drive else runner.worker(task)
            result["seconds"] = round(time.monotonic() - t0, 2)
            out["results"][task] = result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out["seconds"] = round(time.time() - started, 2)
    return out


SERVING_CONFIG = "/etc/provisioner/serving/serving.json"


def _data_dir(args: argparse.Namespace) -> str:
    """Where a run's work directory goes: the data mount (--data-dir), /var/tmp when it is no mount point."""
    return args.data_dir if args.data_dir and os.path.ismount(args.data_dir) else "/var/tmp"


def tune_context(serving: dict[str, Any], serve_script: str | None) -> dict[str, Any]:
    """What the serving knobs read besides the plan's values: what a worker needs itself (its memory
    less its model cache, the plan's SERVING_WORKER_OVERHEAD_BYTES) and the model server's code (the
    hash of the files shipped with it), which a study of theirs resumes only for."""
    out: dict[str, Any] = {}
    if serving.get("worker_memory_bytes") is not None and serving.get("cache_budget_bytes") is not None:
        out["serving_worker_overhead_bytes"] = int(serving["worker_memory_bytes"]) - int(serving["cache_budget_bytes"])
    if serve_script and os.path.isfile(serve_script):
        here, digest = os.path.dirname(os.path.abspath(serve_script)), hashlib.sha256()
        for name in sorted(n for n in os.listdir(here) if n.startswith("provisioner_serve") and n.endswith(".py")):
            with open(os.path.join(here, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read())
        out["serving_code"] = digest.hexdigest()[:12]
    return out


def tune(args: argparse.Namespace) -> dict[str, Any]:
    """provisioner.tune.driver on this host: the workers as for a tuned smoke run at the quick size."""
    from ...tune import driver  # imports Optuna where the study opens: the ML environment's Python runs this
    from ...tune import knobs as knob_table

    signal.signal(signal.SIGTERM, _terminated)
    signal.signal(signal.SIGHUP, driver.hang_up)
    args.mode, args.profile = "tuned", "quick"
    try:
        with open(args.plan, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"no plan at {args.plan} ({exc}): run provisioner up first") from None
    spec = json.loads(args.spec)
    plan = {**doc.get("values", {}), **tune_context(doc.get("serving") or {}, args.serve_script)}
    cpu = cpu_info()
    # As the smoke run: its work directory (a workload's files) on the data mount, /var/tmp when that is no mount;
    # what the mount is (source, filesystem, where) is in the study key of a knob measured on its files.
    data_dir = _data_dir(args)
    mount = data_mount(data_dir)
    plan["data_location"] = f"{mount.get('fstype')} on {mount.get('source')} at {mount.get('target') or data_dir}"
    workdir = tempfile.mkdtemp(prefix="provisioner-tune-", dir=data_dir)
    try:
        os.chmod(workdir, 0o755)
        script = os.path.join(workdir, ARCHIVE)
        worker_archive(script)
        pw = pwd.getpwnam(args.user)
        os.chown(workdir, pw.pw_uid, pw.pw_gid)
        runner = Runner(args, script, workdir, int(plan.get("threads_per_job") or cpu["physical_cores"]), 1)
        # With the values the inventory's options fix (spec "fixed"): the knobs that follow others read it.
        runner.plan, runner.cpu = {**plan, "fixed": list(spec.get("fixed") or [])}, cpu
        # A plan value a role variable set for the host outranks (spec "role_vars"): the value it gives.
        overridden = knob_table.outranked(spec.get("role_vars") or {})
        runner.plan.update({k: v[1] for k, v in overridden.items() if v[1] is not None}, overridden=overridden)
        runner.code = os.path.basename(running_archive() or "")  # provisioner_smoke-<sha12>.pyz
        state_dir = args.state_dir or driver.STATE_DIR
        out = driver.locked(
            state_dir,
            lambda: driver.run(runner, spec, ledger=driver.Ledger(state_dir), busy=cpu_busy, live=driver.Live(state_dir)),
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"host": socket.gethostname(), **out}


# ---------------------------------------------------------------- a worker (inside the ML environment)


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
    t = sub.add_parser(
        "tune", help="measure the knobs' candidates against the plan's rule (as root, the ML environment's Python)"
    )
    t.add_argument("--python", required=True, help="the ML environment's python")
    t.add_argument("--user", required=True, help="run the workloads as this user in a login shell")
    t.add_argument("--plan", default=PLAN_FILE)
    t.add_argument(
        "--spec",
        required=True,
        help="JSON: workloads, knobs (null: all), budget_s, force, allow_oversubscription, fixed, role_vars",
    )
    t.add_argument("--data-dir", default=None, help="the data mount; /var/tmp when it is not a mount point")
    t.add_argument("--state-dir", default=None, help="where the Optuna studies are kept (default /var/lib/provisioner/tune)")
    t.add_argument(
        "--serve-script", default=None, help="the model server (roles/serving/files/provisioner_serve.py): to tune serving"
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
    if args.cmd == "tune":
        print(json.dumps(tune(args)))
        return 0
    if args.mode == "tuned" and not args.user:
        parser.error("tuned mode needs --user")
    if not args.config_only and (not args.only or "serving" in args.only) and not args.serve_script:
        parser.error("the serving workload needs --serve-script (roles/serving/files/provisioner_serve.py)")
    print(json.dumps(run(args)))
    return 0
