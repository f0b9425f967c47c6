"""The no-op re-run of site.yml on fleets of 1, 4 and 8 converged lab servers: wall time and CPU.

    .venv/bin/python benchmarks/fleet_noop.py [--sizes 1,4,8] [--runs 3] [--full]

For each fleet size N: boots N lab servers in parallel (flt-bench-1..N), converges them once
with `provisioner up --tags common,storage,hugepages --no-verify` (the selection of
tests/integration/test_fleet.py's fleet-mechanics tests; --tags another, or --full: every role, the ML environment
from the wheelhouse, still no verify and no smoke test), then re-runs the same command --runs
times and prints, as medians:

- wall: the command's wall time;
- control CPU: user + system seconds of the command and every process it waited for
  (ansible-playbook and its forks, ssh), from getrusage(RUSAGE_CHILDREN);
- target CPU: user + system seconds spent inside the lab servers, summed over each server's
  process tree (utime + stime + cutime + cstime in /proc/PID/stat of its systemd and every
  descendant, before and after the run; a process that ended is counted by the parent that
  reaped it). Lab servers have no cgroup of their own here (systemd-nspawn --keep-unit runs
  them in the caller's cgroup), so /proc is where their CPU time is found;
- the ratio wall / (CPU seconds / 2): this machine has 2 cores, so 1.0 means the run kept both
  busy the whole time and more means it waited (on SSH round trips, on the slowest host);
- fact gathering: the wall seconds of Ansible's fact gathering and of the hardware facts
  module across the fleet (first start to last end, from the run's events) - what a fact
  cache could save at most - and the same no-op re-run with Ansible's jsonfile fact cache
  (gathering=smart: site.yml's first play takes the cached facts instead of gathering them);
- the read-only verbs `provisioner facts` and `provisioner status` on the whole fleet (wall);
- the largest resident set of any control-node process (getrusage's ru_maxrss of the children:
  ansible-playbook's main process, whose copies are the forks).

Figures, never pass/fail: the servers share this machine's two cores with the control node.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import yaml

from provisioner import bundle, lab

CLI = [sys.executable, "-c", "from provisioner.cli import main; main()"]
CORES = 2
TICKS = os.sysconf("SC_CLK_TCK")
FACT_TASKS = ("Gathering Facts", "Gather hardware facts")  # the hardware facts module (role plan)


def tree_cpu_seconds(root_pid: int) -> float:
    """utime + stime + cutime + cstime of root_pid and every descendant, in seconds."""
    total, todo, seen = 0, [root_pid], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
    return total / TICKS


def fleet_inventory(servers: list[lab.LabServer], path: Path) -> Path:
    hosts = {}
    for s in servers:
        hosts.update(yaml.safe_load(s.inventory.read_text())["all"]["children"]["lab"]["hosts"])
    path.write_text(yaml.safe_dump({"all": {"children": {"fleet": {"hosts": hosts}}}}, sort_keys=False))
    return path


def up(inventory: Path, selection: list[str], env: dict[str, str] | None = None) -> dict:
    r = subprocess.run(
        [*CLI, "up", "-i", str(inventory), *selection, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    if r.returncode != 0:
        sys.exit(f"provisioner up failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout)["data"]


def fact_cache_env(directory: Path) -> dict[str, str]:
    """Ansible's own fact cache: the facts of site.yml's first play kept per host in JSON files,
    gathered again only when missing (gathering=smart)."""
    return {
        "ANSIBLE_GATHERING": "smart",
        "ANSIBLE_CACHE_PLUGIN": "ansible.builtin.jsonfile",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(directory),
        "ANSIBLE_CACHE_PLUGIN_TIMEOUT": "3600",
    }


def read_only(verb: str, inventory: Path) -> float:
    """Wall seconds of a read-only verb (facts, plan, status) on the whole fleet."""
    started = time.monotonic()
    r = subprocess.run([*CLI, verb, "-i", str(inventory), "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"provisioner {verb} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return time.monotonic() - started


def measured_up(inventory: Path, selection: list[str], servers: list[lab.LabServer], env: dict[str, str] | None = None) -> dict:
    targets_before = sum(tree_cpu_seconds(s.leader_pid) for s in servers)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    data = up(inventory, selection, env)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    targets = sum(tree_cpu_seconds(s.leader_pid) for s in servers) - targets_before
    control = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    changed = {h: v["changed"] for h, v in data["hosts"].items() if v["changed"]}
    if changed:
        sys.exit(f"the re-run changed tasks on converged servers: {changed}")
    return {
        "wall": wall,
        "control": control,
        "targets": targets,
        "ratio": wall / ((control + targets) / CORES),
        # The largest resident set of any process waited for so far (ansible-playbook's own).
        "max_rss_mib": after.ru_maxrss / 1024,
        "facts": fact_wall(Path(data["artifact_dir"])),
        "tasks": sum(v["ok"] + v["skipped"] for v in data["hosts"].values()),
    }


def fact_wall(artifact_dir: Path) -> dict[str, float]:
    """Per fact task: seconds from its first start to its last end on any host."""
    spans: dict[str, list[datetime]] = {}
    for f in (artifact_dir / "job_events").glob("*.json"):
        e = json.loads(f.read_text())
        d = e.get("event_data") or {}
        if e.get("event") != "runner_on_ok" or d.get("task") not in FACT_TASKS or not d.get("start"):
            continue
        spans.setdefault(d["task"], []).extend((datetime.fromisoformat(d["start"]), datetime.fromisoformat(d["end"])))
    return {task: (max(s) - min(s)).total_seconds() for task, s in spans.items()}


def bench(size: int, runs: int, selection: list[str], workdir: Path) -> dict:
    names = [f"flt-bench-{i}" for i in range(1, size + 1)]
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(size) as pool:
            servers = list(pool.map(lab.up, names))
        boot = time.monotonic() - started
        inventory = fleet_inventory(servers, workdir / f"fleet-{size}.yml")
        started = time.monotonic()
        up(inventory, selection)
        converge = time.monotonic() - started
        results = [measured_up(inventory, selection, servers) for _ in range(runs)]
        cache = fact_cache_env(workdir / f"facts-{size}")
        up(inventory, selection, cache)  # fills the cache
        cached = [measured_up(inventory, selection, servers, cache)["wall"] for _ in range(runs)]
        verbs = {
            f"{verb}_verb": statistics.median(read_only(verb, inventory) for _ in range(runs)) for verb in ("facts", "status")
        }
    finally:
        for name in names:
            lab.down(name)
    med = {k: statistics.median(r[k] for r in results) for k in ("wall", "control", "targets", "ratio", "max_rss_mib")}
    facts = {t: statistics.median(r["facts"].get(t, 0.0) for r in results) for t in results[0]["facts"]}
    return {
        "cached_wall": statistics.median(cached),
        **verbs,
        "size": size,
        "boot": boot,
        "converge": converge,
        "runs": len(results),
        "tasks": results[0]["tasks"],
        **med,
        "facts": facts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,8", help="fleet sizes, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="no-op re-runs per size (medians)")
    parser.add_argument("--tags", default="common,storage,hugepages", help="roles to run (test_fleet.py's fleet-mechanics selection)")
    parser.add_argument("--full", action="store_true", help="every role of site.yml (the ML stack from the wheelhouse)")
    args = parser.parse_args()
    selection = ["--no-verify", "--tags", args.tags]
    if args.full:
        wheelhouse = bundle.build_wheelhouse(bundle.default_wheelhouse(), ["core", "gbdt"]).path
        selection = ["--no-verify", "--no-smoke", "-e", f"mlstack_wheelhouse={wheelhouse}"]
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"fleet-noop-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"no-op re-run of site.yml ({' '.join(selection)}), {args.runs} run(s) per size, medians; {CORES} cores")
    print(
        f"{'hosts':>5} {'boot s':>7} {'converge s':>10} {'tasks':>6} {'wall s':>7} {'control CPU s':>13} "
        f"{'target CPU s':>12} {'wall/(CPU/2)':>12} {'wall s/host':>11}  fact gathering (wall s)"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        r = bench(size, args.runs, selection, workdir)
        facts = ", ".join(f"{t} {s:.2f}" for t, s in sorted(r["facts"].items()))
        print(
            f"{r['size']:>5} {r['boot']:>7.1f} {r['converge']:>10.1f} {r['tasks']:>6} {r['wall']:>7.1f} "
            f"{r['control']:>13.1f} {r['targets']:>12.1f} {r['ratio']:>12.2f} {r['wall'] / r['size']:>11.1f}  {facts}",
            flush=True,
        )
        print(
            f"{'':>5} with Ansible's fact cache (gathering=smart, jsonfile): {r['cached_wall']:.1f} s wall "
            f"({r['cached_wall'] - r['wall']:+.1f} s); read-only verbs: facts {r['facts_verb']:.1f} s, status {r['status_verb']:.1f} s; "
            f"largest control-node process {r['max_rss_mib']:.0f} MiB",
            flush=True,
        )


if __name__ == "__main__":
    main()
