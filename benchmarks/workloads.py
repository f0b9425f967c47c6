"""The smoke test's workloads of real jobs, tuned against baseline, on this machine; prints medians.

    .venv/bin/python benchmarks/workloads.py --python VENV/bin/python [--runs 3] [--profile quick]
        [--only sklearn features matrix hpo dataloader tensorflow]

Runs each workload's worker of roles/smoke/files/provisioner_smoke.py directly with an ML
environment's python (no lab server, nothing installed): tuned, as role thread_env sets a
job's threads (OMP/OPENBLAS/MKL/POLARS/LOKY variables = the physical cores, the workloads
taking their plan values from `--plan` or deriving their own), and baseline, in an empty
environment with the libraries' defaults. Each run is judged by provisioner.smoke against its
limit; the script prints, per check, the median figure of each mode over the runs, its ratio
to the limit, the status, and before -> after. Figures, never pass/fail: machines are noisy.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from provisioner import smoke

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "roles/smoke/files/provisioner_smoke.py"
WORKLOADS = ("sklearn", "features", "matrix", "hpo", "dataloader", "tensorflow")


def load_script():
    spec = importlib.util.spec_from_file_location("provisioner_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Runner:
    """What the smoke script's parent does for a worker, without runuser: the tuned environment is
    the thread variables role thread_env exports, the baseline an empty one."""

    def __init__(self, python: str, mode: str, profile: str, threads: int, plan: dict[str, Any], workdir: str):
        self.python, self.mode, self.profile, self.threads, self.plan, self.workdir = python, mode, profile, threads, plan, workdir

    def worker(self, task: str, **extra: Any) -> dict[str, Any]:
        params = {"task": task, "profile": self.profile, "mode": self.mode, "threads": self.threads, "trials": self.threads,
                  "workdir": self.workdir, "plan": self.plan, **extra}
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.workdir, "LANG": "C.UTF-8"}
        if self.mode == "tuned":
            for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "POLARS_MAX_THREADS",
                        "LOKY_MAX_CPU_COUNT", "TF_NUM_INTRAOP_THREADS"):
                env[var] = str(self.threads)
            env.update(TF_NUM_INTEROP_THREADS="1", TF_ENABLE_ONEDNN_OPTS="1")
        r = subprocess.run([self.python, str(SCRIPT), "worker", json.dumps(params)], capture_output=True, text=True,
                           env=env, cwd=self.workdir, check=False)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if r.returncode != 0 or not lines:
            tail = (r.stderr or r.stdout).strip().splitlines()
            return {"error": f"{task}: exited {r.returncode}: {tail[-1] if tail else 'no output'}"}
        return json.loads(lines[-1])


def measure(script, runner: Runner, task: str) -> dict[str, Any]:
    t0 = time.monotonic()
    result = script.features(runner) if task == "features" else runner.worker(task)
    result["seconds"] = round(time.monotonic() - t0, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="an ML environment's python (roles/mlstack's, or a venv of the lock)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", choices=("quick", "full"), default="quick")
    parser.add_argument("--only", nargs="*", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--plan", help="a plan.json whose values the tuned workloads follow (default: they derive their own)")
    args = parser.parse_args()
    script = load_script()
    cpu = script.cpu_info()
    cores = cpu["physical_cores"]
    plan: dict[str, Any] = {}
    if args.plan:
        plan = json.loads(Path(args.plan).read_text()).get("values", {})
    plan_values = {k: plan.get(k) for k in script.WORKLOAD_PLAN_VALUES}
    figures: dict[str, dict[str, list[Any]]] = {}
    seconds: dict[str, dict[str, list[float]]] = {}
    workdir = tempfile.mkdtemp(prefix="provisioner-workloads-", dir="/var/tmp")
    try:
        for i in range(args.runs):
            for mode in ("baseline", "tuned"):
                results = {}
                for task in args.only:
                    run_dir = tempfile.mkdtemp(dir=workdir)
                    results[task] = measure(script, Runner(args.python, mode, args.profile, cores, plan_values, run_dir),
                                            task)
                    shutil.rmtree(run_dir, ignore_errors=True)
                    seconds.setdefault(task, {}).setdefault(mode, []).append(results[task]["seconds"])
                raw = {"mode": mode, "profile": args.profile, "threads": cores, "trials": cores, "cpu": cpu,
                       "plan": {"threads_per_job": cores, **plan_values}, "results": results}
                for c in smoke.evaluate(raw).checks:
                    if c.group == "configuration":
                        continue
                    figures.setdefault(c.id, {}).setdefault(mode, []).append(c)
                print(f"run {i + 1} {mode}: " + ", ".join(f"{t} {results[t]['seconds']:.1f} s" for t in args.only),
                      file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    def med(values: list[float]) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    print(f"\n{cpu['model_name']}, {cores} physical cores, --{args.profile}, {args.runs} run(s) of each mode; medians")
    print(f"{'check':22s} {'unit':16s} {'baseline':>12s} {'tuned':>12s} {'tuned/limit':>12s} {'after/before':>13s}  status")
    for cid, modes in figures.items():
        tuned, base = modes.get("tuned", []), modes.get("baseline", [])
        t_fig, b_fig = med([c.figure for c in tuned]), med([c.figure for c in base])
        t_ratio = med([c.ratio for c in tuned])
        higher = (tuned or base)[0].higher_is_better
        gain = (t_fig / b_fig if higher else b_fig / t_fig) if t_fig and b_fig else None
        statuses = "/".join(sorted({c.status for c in tuned})) or "-"
        unit = (tuned or base)[0].unit
        print(f"{cid:22s} {unit:16s} {smoke.number(b_fig) or '-':>12s} {smoke.number(t_fig) or '-':>12s} "
              f"{f'{t_ratio:.2f}' if t_ratio is not None else '-':>12s} {f'{gain:.2f}x' if gain else '-':>13s}  {statuses}")
        for c in tuned[-1:]:
            if c.status not in (smoke.PASS, smoke.INFO):
                print(f"  {c.reason}")
    print("\nseconds per workload (median): " + ", ".join(
        f"{t} {med(m.get('baseline', [])) or 0:.1f} -> {med(m.get('tuned', [])) or 0:.1f}" for t, m in seconds.items()))


if __name__ == "__main__":
    main()
