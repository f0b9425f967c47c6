"""The no-op re-run of site.yml on one converged lab server, task by task.

    .venv/bin/python benchmarks/noop_rerun.py [--server NAME] [--runs 3] [--keep] [--profile DIR]

Boots a lab server (or takes the one named with --server, already up), converges it once with
`provisioner up --no-verify --no-smoke` from the wheelhouse, then re-runs the same command
--runs times with Ansible's profile_tasks callback. Prints the wall time of the command (median
and range), the seconds ansible-playbook itself took, the task count (ok / skipped / changed)
and the ten slowest tasks of the median run as profile_tasks measured them. Then times
`provisioner status` on the converged server the same number of times (goal: 5 s per host for
the status script).

With --profile DIR, one more no-op run goes under cProfile: ansible-playbook itself (DIR/parent.out)
and every worker it forks, one per task and host (DIR/w-PID.out); the top cumulative items of
both are printed (the profiler slows the run, so its wall time is no figure of the others).

Figures, never pass/fail: the lab server shares this machine's cores, so medians are printed.
The strategy is provisioner's default (Mitogen); PROVISIONER_STRATEGY=linear measures Ansible's own.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from provisioner import bundle, engine, lab

# The CLI of the provisioner package this interpreter imports (PYTHONPATH picks another tree).
CLI = [sys.executable, "-c", "from provisioner.cli import main; main()"]
# profile_tasks' summary line: "role : Task name --------- 1.23s"
SUMMARY_LINE = re.compile(r"^(?P<task>.+?) -{3,} (?P<seconds>\d+\.\d+)s$")


def up(inventory: str, offline: tuple[str, ...], profile: bool, extra_env: dict[str, str] | None = None) -> tuple[float, dict]:
    env = dict(os.environ) | (extra_env or {})
    if profile:
        env |= {
            "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks",
            "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all",
            "PROFILE_TASKS_SUMMARY_ONLY": "true",
        }
    started = time.monotonic()
    r = subprocess.run(
        [*CLI, "up", "-i", inventory, "--no-verify", "--no-smoke", *offline, "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    seconds = time.monotonic() - started
    if r.returncode != 0:
        sys.exit(f"provisioner up failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return seconds, json.loads(r.stdout)["data"]


def status(inventory: str, name: str) -> tuple[float, float]:
    """Wall seconds of `provisioner status` and the seconds its script took on the host."""
    started = time.monotonic()
    r = subprocess.run([*CLI, "status", "-i", inventory, "--json"], capture_output=True, text=True)
    seconds = time.monotonic() - started
    if r.returncode != 0:
        sys.exit(f"provisioner status found drift or failed ({r.returncode}): {r.stdout.strip()[-2000:]}")
    return seconds, json.loads(r.stdout)["data"]["hosts"][name]["seconds"]


# Actions that run on the control node (no module on the target).
LOCAL_ACTIONS = {
    f"{prefix}{name}"
    for prefix in ("", "ansible.builtin.")
    for name in ("set_fact", "assert", "debug", "fail", "include_role", "include_tasks", "validate_argument_spec", "meta")
}
FLOOR_TASKS = 100
FLOOR_KINDS = {
    "remote": {"ansible.builtin.stat": {"path": "/etc/hostname", "get_checksum": False}},
    "local": {"ansible.builtin.set_fact": {"floor_x": 1}},
    "skipped": {"ansible.builtin.stat": {"path": "/etc/hostname"}, "when": False},
}


def task_mix(artifact_dir: Path) -> collections.Counter[str]:
    """site.yml's tasks of one run by kind (remote module, local action, skipped), from its events."""
    mix: collections.Counter[str] = collections.Counter()
    for path in (artifact_dir / "job_events").glob("*.json"):
        event = json.loads(path.read_text())
        if event.get("event") == "runner_on_skipped":
            mix["skipped"] += 1
        elif event.get("event") == "runner_on_ok":
            mix["local" if event["event_data"].get("task_action") in LOCAL_ACTIONS else "remote"] += 1
    return mix


def floor(inventory: str) -> dict[str, float]:
    """Seconds per task of each kind on the server, with provisioner's own Ansible settings."""
    env = {**os.environ, **engine._run_env(False, "site.yml")}
    ansible_playbook = str(Path(sys.executable).parent / "ansible-playbook")

    def run(tasks: list[dict]) -> float:
        with tempfile.NamedTemporaryFile("w", suffix=".yml") as book:
            yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": tasks}], book)
            started = time.monotonic()
            subprocess.run([ansible_playbook, "-i", inventory, book.name], env=env, check=True, capture_output=True)
            return time.monotonic() - started

    one = run([{"name": "one", **FLOOR_KINDS["remote"]}])  # start-up and the connection
    return {
        kind: max(run([{"name": f"{kind} {i}", **task} for i in range(FLOOR_TASKS)]) - one, 0.0) / FLOOR_TASKS
        for kind, task in FLOOR_KINDS.items()
    }


def profile(artifact_dir: Path) -> list[tuple[str, float]]:
    """The tasks and their seconds, slowest first, from profile_tasks' summary."""
    text = (artifact_dir / "stdout").read_text()
    tail = text.rsplit("PLAY RECAP", 1)[-1]
    found = [(m["task"].strip(), float(m["seconds"])) for m in map(SUMMARY_LINE.match, tail.splitlines()) if m]
    if not found:
        sys.exit(f"no profile_tasks summary in {artifact_dir / 'stdout'}: is ansible.posix installed?")
    return found


# Put first on PATH: ansible-runner then starts ansible-playbook under cProfile, and the
# sitecustomize beside it profiles each forked worker's task into its own file.
SHIM = """#!/bin/sh
export PYTHONPATH={shim}${{PYTHONPATH:+:$PYTHONPATH}}
exec {python} -m cProfile -o {out}/parent.out {playbook} "$@"
"""
WORKER_HOOK = """import os
if os.environ.get("NOOP_PROFILE_DIR"):
    from ansible.executor.process import worker as _worker
    _run = _worker.WorkerProcess._run
    def _profiled(self, *args, **kwargs):
        import cProfile
        profile = cProfile.Profile()
        profile.enable()
        try:
            return _run(self, *args, **kwargs)
        finally:
            profile.disable()
            profile.dump_stats(os.path.join(os.environ["NOOP_PROFILE_DIR"], f"w-{os.getpid()}.out"))
    _worker.WorkerProcess._run = _profiled
"""


def profiled_run(inventory: str, offline: tuple[str, ...], out: Path) -> None:
    import pstats

    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.out"):
        old.unlink()
    bindir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory() as shim:
        (Path(shim) / "sitecustomize.py").write_text(WORKER_HOOK)
        playbook = Path(shim) / "ansible-playbook"
        playbook.write_text(SHIM.format(shim=shim, python=sys.executable, out=out, playbook=bindir / "ansible-playbook"))
        playbook.chmod(0o755)
        # bindir after the shim: the CLI puts it first only when PATH lacks it.
        path = os.pathsep.join([shim, str(bindir), os.environ.get("PATH", "")])
        seconds, _ = up(inventory, offline, profile=False, extra_env={"PATH": path, "NOOP_PROFILE_DIR": str(out)})
    workers = []
    for f in sorted(out.glob("w-*.out")):
        try:
            pstats.Stats(str(f))
            workers.append(str(f))
        except (EOFError, ValueError, TypeError):  # a worker ended while writing its file
            pass
    print(f"profiled run: {seconds:.1f} s wall under cProfile; {len(workers)} worker profiles in {out}")
    for title, files in (("ansible-playbook", [str(out / "parent.out")]), (f"{len(workers)} workers summed", workers)):
        if files:
            print(f"top cumulative, {title}:")
            stats = pstats.Stats(*files, stream=sys.stdout)
            stats.files = []  # pstats would print a line per file: 300 of them for the workers
            stats.sort_stats("cumulative").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", help="an existing lab server (converged here first); default: a new one")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the new lab server up")
    parser.add_argument("--profile", type=Path, metavar="DIR", help="one more run under cProfile, its files in DIR")
    args = parser.parse_args()
    name = args.server or "pv-bench-noop"
    made = not args.server
    try:
        server = lab.up(name)
        wheelhouse = bundle.build_wheelhouse(bundle.default_wheelhouse(), list(bundle.DEFAULT_COMPONENTS)).path
        offline = ("-e", f"mlstack_wheelhouse={wheelhouse}")
        inv = str(server.inventory)
        converge, _ = up(inv, offline, profile=False)
        runs = []
        for _ in range(args.runs):
            seconds, out = up(inv, offline, profile=True)
            host = out["hosts"][name]
            if host["changed"]:
                sys.exit(f"the re-run changed {host['changed']} task(s) on a converged server: {out['changes']}")
            runs.append((seconds, out["seconds"], host, Path(out["artifact_dir"])))
        statuses = [status(inv, name) for _ in range(args.runs)]
        runs.sort(key=lambda r: r[0])
        mix = task_mix(runs[len(runs) // 2][3])
        costs = floor(inv)
        if args.profile:
            profiled_run(inv, offline, args.profile)
    finally:
        if made and not args.keep:
            lab.down(name)
    walls = [r[0] for r in runs]
    _, ansible_seconds, host, artifacts = runs[len(runs) // 2]
    tasks = profile(artifacts)
    strategy = os.environ.get(engine.STRATEGY_ENV) or engine.DEFAULT_STRATEGY
    print(f"strategy: {strategy} ({engine.STRATEGY_ENV}=linear for Ansible's own)")
    print(f"converge (first run or already converged): {converge:.1f} s")
    print(
        f"no-op re-run of site.yml on {name}, median of {len(walls)}: {statistics.median(walls):.1f} s wall "
        f"(min {min(walls):.1f}, max {max(walls):.1f}); ansible-playbook {ansible_seconds:.1f} s of the median run"
    )
    print(
        f"tasks: {host['ok'] + host['skipped'] + host['changed']} "
        f"(ok {host['ok']}, skipped {host['skipped']}, changed {host['changed']}); "
        f"profile_tasks summed {sum(s for _, s in tasks):.1f} s over {len(tasks)} tasks"
    )
    print("top ten tasks (profile_tasks, median run):")
    for task, seconds in tasks[:10]:
        print(f"  {seconds:6.2f} s  {task}")
    least = sum(costs[kind] * n for kind, n in mix.items())
    print(
        "per-task cost of trivial tasks on this server: "
        + ", ".join(f"{kind} {costs[kind] * 1000:.0f} ms" for kind in FLOOR_KINDS)
    )
    print(
        "site.yml's mix (" + ", ".join(f"{mix[k]} {k}" for k in FLOOR_KINDS) + f") costs at least {least:.1f} s of "
        f"ansible-playbook's {ansible_seconds:.1f} s ({least / ansible_seconds:.0%}); at that cost 15 s holds at most "
        f"{15 / max(least / max(sum(mix.values()), 1), 1e-9):.0f} tasks of this mix"
    )
    script = statistics.median(s for _, s in statuses)
    print(
        f"provisioner status, median of {len(statuses)}: {statistics.median(w for w, _ in statuses):.1f} s wall, "
        f"the status script {script:.1f} s on the host ({script / 5:.0%} of the 5 s goal)"
    )


if __name__ == "__main__":
    main()
