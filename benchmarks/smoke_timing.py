"""Times the quick smoke test on a provisioned lab server; prints the medians per workload.

    .venv/bin/python benchmarks/smoke_timing.py [--runs 3] [--profile quick] [--keep] [--against DIR]

Builds a wheelhouse (core, gbdt, torch, hpo; `--tensorflow` adds that component), provisions a
fresh lab server from it without the smoke step, then runs `provisioner smoke` --runs times.
Prints the wall time of each run, the total and the seconds each workload took (median over
the runs, against the quick profile's budget of 2 minutes on 2 cores with every workload in)
and the headline figures with their ratio to the hardware's limit. Figures, never pass/fail:
these machines are noisy.

--against DIR also runs the smoke test with the provisioner of another checkout (DIR, e.g. a git
worktree of an earlier commit: its package, roles and workload code) on the same server, run by run
interleaved with this one (A B A B: drift cancels), and prints both medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from provisioner import bundle, lab

BIN = Path(sys.executable).parent / "provisioner"
COMPONENTS = ["core", "gbdt", "torch", "hpo"]
QUICK_BUDGET_S = 120.0  # the quick smoke test on 2 cores, every workload in


def run(*args: str, tree: str | None = None) -> tuple[float, dict]:
    """`provisioner ARGS --json`: its seconds and data; with TREE, that checkout's package runs."""
    env = {**os.environ, "PYTHONPATH": tree} if tree else None
    started = time.monotonic()
    r = subprocess.run([str(BIN), *args, "--json"], capture_output=True, text=True, env=env)
    seconds = time.monotonic() - started
    if not r.stdout.strip():
        sys.exit(f"provisioner {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return seconds, json.loads(r.stdout)["data"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", choices=("quick", "full"), default="quick")
    parser.add_argument("--keep", action="store_true", help="leave the lab server up")
    parser.add_argument("--tensorflow", action="store_true", help="install the tensorflow component too")
    parser.add_argument("--against", metavar="DIR", help="another checkout whose smoke test runs interleaved, for comparison")
    args = parser.parse_args()
    name = "pv-bench-smoke"
    components = COMPONENTS + (["tensorflow"] if args.tensorflow else [])
    wheels = bundle.build_wheelhouse(bundle.default_wheelhouse(), components).path
    server = lab.up(name)
    try:
        inv = str(server.inventory)
        comps = "[" + ",".join(components) + "]"
        up_s, up = run("up", "-i", inv, "--no-smoke", "-e", f"mlstack_wheelhouse={wheels}", "-e", f"mlstack_components={comps}")
        if up["exit_code"] != 0:
            sys.exit(f"provisioning the lab server failed: {up['hosts']}")
        print(f"provisioned {name} in {up_s:.0f} s")
        walls, per_task, reports, against = [], {}, [], []
        profile = ["--full"] if args.profile == "full" else []
        for i in range(args.runs):
            if args.against:
                wall, out = run("smoke", "-i", inv, *profile, tree=str(Path(args.against).resolve()))
                against.append(wall)
                print(f"run {i + 1} of {args.against}: {wall:.1f} s wall, status {out['hosts'][name]['status']}")
            wall, out = run("smoke", "-i", inv, *profile)
            rep = out["hosts"][name]
            reports.append(rep)
            walls.append(wall)
            for task, seconds in rep["workloads"].items():
                per_task.setdefault(task, []).append(seconds)
            print(f"run {i + 1}: {wall:.1f} s wall, {rep['seconds']:.1f} s on the target, status {rep['status']}")
        total = statistics.median(walls)
        budget = (
            f" (budget {QUICK_BUDGET_S:.0f} s: {'within' if total <= QUICK_BUDGET_S else 'OVER'})"
            if args.profile == "quick"
            else ""
        )
        print(
            f"\nsmoke --{args.profile}: median {total:.1f} s wall{budget} "
            f"(min {min(walls):.1f}, max {max(walls):.1f}, {len(walls)} runs)"
        )
        if against:
            other = statistics.median(against)
            print(
                f"  {args.against}: median {other:.1f} s wall (min {min(against):.1f}, max {max(against):.1f}); "
                f"this tree / that one: {total / other:.2f}"
            )
        print(f"  {'on the target':14s} {statistics.median([r['seconds'] for r in reports]):6.1f} s")
        for task, secs in per_task.items():
            print(f"  {task:14s} {statistics.median(secs):6.1f} s")
        print("\nheadline figures (last run):")
        for c in reports[-1]["checks"]:
            if c["figure"] is not None:
                ratio = f"{c['ratio']:.2f} of limit" if c["ratio"] is not None else "no limit"
                print(f"  {c['title']:45s} {c['figure']:12.3g} {c['unit']:14s} {ratio:16s} {c['status']}")
    finally:
        if not args.keep:
            lab.down(name)


if __name__ == "__main__":
    main()
