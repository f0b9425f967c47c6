"""The smoke test's workloads of real jobs, tuned against baseline, on this machine; prints medians.

    .venv/bin/python benchmarks/workloads.py --python VENV/bin/python [--runs 3] [--profile quick]
        [--only sklearn features matrix hpo dataloader tensorflow] [--plan plan.json]

Builds the smoke zipapp (provisioner.smoke.zipapp) into a temporary directory and runs each chosen
workload as the target's parent does (provisioner.smoke.target.parent.Runner, a workload's drive
where it has one), its workers run by the ML environment's python given (no lab server, nothing
installed), in two modes:

- tuned: an empty environment plus the variables role thread_env exports (its defaults: every
  variable of thread_env_variables the threads of one job, Polars' and joblib's counts, Arrow's IO
  pool, the inter-op pools, the DataLoader's split, TF_ENABLE_ONEDNN_OPTS), the workloads taking the
  plan's values from `--plan` (/etc/provisioner/plan.json of a provisioned host) or, without one,
  deriving their own from the physical cores. No login shell: this machine's own settings stay out.
  An environment role mlstack did not build lacks its start-up hook, which gives each of joblib's
  workers its share of the threads: its tuned grid search oversubscribes (the script says so);
- baseline: an empty environment with the libraries' defaults, as the parent runs it.

Each run is judged by the control node's evaluation (provisioner.smoke.evaluate); the script
prints, per check, the median figure of each mode over the runs, the tuned figure's ratio to its
limit, after/before (provisioner.smoke.attach_baseline on the medians) and the statuses. Figures,
never pass/fail: machines are noisy. --only offers every registered workload that runs on one
machine (serving needs a model server, cluster a Ray cluster: `provisioner smoke` measures them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from provisioner import smoke
from provisioner.smoke import zipapp
from provisioner.smoke.target import parent, probe
from provisioner.smoke.workloads import BY_NAME, PROFILES

ROOT = Path(__file__).resolve().parents[1]
THREAD_ENV_DEFAULTS = ROOT / "roles/thread_env/defaults/main.yml"
# Workloads that need more than this machine: `provisioner smoke` measures them on a lab server.
NEEDS_MORE = {"serving": "a model server and wrk", "cluster": "a Ray cluster"}
LOCAL = tuple(name for name in BY_NAME if name not in NEEDS_MORE)
# The workloads of real jobs, whose figures the thread variables move the most.
DEFAULT = ("sklearn", "features", "matrix", "hpo", "dataloader", "tensorflow")


def thread_env(plan: dict[str, Any], cores: int, sockets: int) -> dict[str, str]:
    """What role thread_env exports for one job with these plan values (its defaults/main.yml and
    vars/main.yml): the plan's threads_per_job, else the physical cores."""
    defaults = yaml.safe_load(THREAD_ENV_DEFAULTS.read_text())
    threads = int(plan.get("threads_per_job") or cores)

    def value(key: str, fallback: int) -> int:
        return int(plan[key]) if plan.get(key) is not None else fallback

    workers = value("dataloader_workers", 0 if threads < 2 else max(1, threads // 4))
    env = {name: threads for name in defaults["thread_env_variables"]}
    env.update(
        POLARS_MAX_THREADS=value("polars_threads", threads),
        LOKY_MAX_CPU_COUNT=value("joblib_workers", threads),
        PROVISIONER_THREADS=threads,  # the ML environment's hook shares it among joblib's workers
        ARROW_IO_THREADS=int(plan.get("arrow_io_threads") or 8),
        TF_NUM_INTEROP_THREADS=int(plan.get("tf_inter_op_threads") or sockets),
        PROVISIONER_TORCH_INTEROP_THREADS=int(plan.get("torch_interop_threads") or sockets),
        PROVISIONER_DATALOADER_WORKERS=workers,
        PROVISIONER_DATALOADER_THREADS=value("dataloader_threads", max(1, threads - workers)),
    )
    out = {name: str(count) for name, count in env.items()}
    if defaults["thread_env_tf_onednn"]:
        out["TF_ENABLE_ONEDNN_OPTS"] = "1"
    if plan.get("openmp_runtime") == "libiomp":
        out["KMP_BLOCKTIME"] = str(value("kmp_blocktime", 1))
        out["KMP_AFFINITY"] = defaults["thread_env_kmp_affinity"]
    return out


class Runner(parent.Runner):
    """The parent's Runner with no login shell: it always starts a worker as in baseline mode (an
    empty environment); in tuned mode with the thread variables on top (the parent's env=, as tune
    gives its candidates) and the worker told it runs tuned (a worker's extra parameters come last)."""

    def __init__(self, args: argparse.Namespace, script: str, workdir: str, raw: dict[str, Any], tuned: dict[str, str] | None):
        super().__init__(argparse.Namespace(**vars(args), mode="baseline"), script, workdir, raw["threads"], raw["trials"])
        self.cpu, self.tuned = raw["cpu"], tuned

    def worker(self, task: str, env: dict[str, str | None] | None = None, **extra: Any) -> dict[str, Any]:
        if self.tuned is None:
            return super().worker(task, env, **extra)
        return super().worker(task, {**self.tuned, **(env or {})}, **{"mode": "tuned", **extra})


def run(args: argparse.Namespace, script: str, mode: str, plan: dict[str, Any], tuned: dict[str, str] | None) -> smoke.HostReport:
    """The chosen workloads in one mode, each in a work directory of its own, judged as the parent's
    raw result is (its keys the judgement reads; no configuration: this machine is not provisioned)."""
    cpu = probe.cpu_info()
    raw: dict[str, Any] = {
        "schema": parent.SCHEMA,
        "host": os.uname().nodename,
        "mode": mode,
        "profile": args.profile,
        "sizes": PROFILES[args.profile],
        "python": args.python,
        "user": "thread_env's variables, no login shell" if tuned else "empty environment",
        "cpu": cpu,
        "memory": {"total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), **probe.memory_devices()},
        "plan": {k: plan.get(k) for k in ("threads_per_job", "trials", "threads_per_trial", *parent.WORKLOAD_PLAN_VALUES)},
        "threads": int(plan.get("threads_per_job") or cpu["physical_cores"]),
        "trials": int(plan.get("trials") or cpu["physical_cores"]),
        "results": {},
    }
    for task in args.only:
        workdir = tempfile.mkdtemp(prefix="provisioner-workloads-", dir="/var/tmp")
        try:
            runner = Runner(args, script, workdir, raw, tuned)
            runner.plan = plan
            drive = getattr(BY_NAME[task], "drive", None)
            started = time.monotonic()
            result = drive(runner) if drive else runner.worker(task)
            result["seconds"] = round(time.monotonic() - started, 2)
            raw["results"][task] = result
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    return smoke.evaluate(raw)


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def medians(reports: list[smoke.HostReport]) -> smoke.HostReport:
    """One report of the runs' median figures and ratios per check (the last run's check otherwise);
    the host's configuration checks left out (this machine is not provisioned)."""
    by_id: dict[str, list[smoke.Check]] = {}
    for report in reports:
        for c in report.checks:
            if c.group != "configuration":
                by_id.setdefault(c.id, []).append(c)
    checks = [
        replace(cs[-1], figure=median([c.figure for c in cs]), ratio=median([c.ratio for c in cs]), status=_statuses(cs))
        for cs in by_id.values()
    ]
    seconds = {task: median([r.workloads.get(task) for r in reports]) or 0.0 for task in reports[-1].workloads}
    return replace(reports[-1], checks=checks, workloads=seconds)


def _statuses(checks: list[smoke.Check]) -> str:
    return "/".join(sorted({c.status for c in checks}))


def start_up_hook(python: str) -> bool:
    """Whether this python loads the ML environment's start-up hook (role mlstack's provisioner_threads)."""
    probe_hook = "import sys; print('provisioner_threads' in sys.modules)"
    r = subprocess.run([python, "-c", probe_hook], capture_output=True, text=True, env={}, check=False)
    return r.stdout.strip() == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--python", required=True, help="an ML environment's python (roles/mlstack's, or a venv of the lock)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", choices=tuple(PROFILES), default="quick")
    parser.add_argument("--only", nargs="*", choices=LOCAL, default=list(DEFAULT), metavar="WORKLOAD", help=", ".join(LOCAL))
    parser.add_argument("--plan", help="a plan.json whose values the tuned workloads follow (default: they derive their own)")
    args = parser.parse_args()
    plan: dict[str, Any] = json.loads(Path(args.plan).read_text()).get("values", {}) if args.plan else {}
    cpu = probe.cpu_info()
    sockets = len({fields.get("physical id", "0") for fields in probe._cpuinfo()}) or 1
    tuned_env = thread_env(plan, cpu["physical_cores"], sockets)
    if not start_up_hook(args.python):
        print(
            f"note: {args.python} has no start-up hook (roles/mlstack/files/provisioner_threads.py): joblib's "
            "workers each take the exported threads, as in an ML environment role mlstack did not build "
            "(copy provisioner_threads.py and .pth from there into its site-packages to add it)",
            file=sys.stderr,
        )
    reports: dict[str, list[smoke.HostReport]] = {"baseline": [], "tuned": []}
    with tempfile.TemporaryDirectory(prefix="provisioner-workloads-") as build_dir:
        script = str(zipapp.build(build_dir))
        for i in range(args.runs):
            for mode in ("baseline", "tuned"):
                report = run(args, script, mode, plan if mode == "tuned" else {}, tuned_env if mode == "tuned" else None)
                reports[mode].append(report)
                print(f"run {i + 1} {mode}: " + ", ".join(f"{t} {s:.1f} s" for t, s in report.workloads.items()), file=sys.stderr)
    tuned, base = medians(reports["tuned"]), medians(reports["baseline"])
    smoke.attach_baseline(tuned, base)
    base_figures = {c.id: c.figure for c in base.checks}
    tuned_ids = {c.id for c in tuned.checks}

    cores = cpu["physical_cores"]
    print(f"\n{cpu['model_name']}, {cores} physical cores, --profile {args.profile}, {args.runs} run(s) of each mode; medians")
    print(f"tuned environment: {' '.join(f'{k}={v}' for k, v in tuned_env.items())}")
    print(f"{'check':24s} {'unit':16s} {'baseline':>12s} {'tuned':>12s} {'tuned/limit':>12s} {'after/before':>13s}  status")
    for c in tuned.checks + [c for c in base.checks if c.id not in tuned_ids]:
        ours = c.id in tuned_ids
        t_fig, ratio, gain = (c.figure, c.ratio, c.gain) if ours else (None, None, None)
        print(
            f"{c.id:24s} {c.unit:16s} {smoke.number(base_figures.get(c.id)) or '-':>12s} {smoke.number(t_fig) or '-':>12s} "
            f"{f'{ratio:.2f}' if ratio is not None else '-':>12s} {f'{gain:.2f}x' if gain else '-':>13s}  "
            f"{c.status if ours else 'baseline only: ' + c.status}"
        )
        if ours and c.status not in (smoke.PASS, smoke.INFO):
            print(f"  {c.reason}")
    print(
        "\nseconds per workload (median), baseline -> tuned: "
        + ", ".join(f"{t} {base.workloads.get(t, 0):.1f} -> {s:.1f}" for t, s in tuned.workloads.items())
    )


if __name__ == "__main__":
    main()
