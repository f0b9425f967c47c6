"""A Ray cluster of three lab servers (role ray): start to all nodes joined, and distributed trials
on the cluster against the head alone.

    .venv/bin/python benchmarks/ray_cluster.py [--runs 3] [--keep]

Boots ray-bench-h (group ray_head), ray-bench-w1 and ray-bench-w2 (group ray_workers) in
parallel, sets them up once with `provisioner up --tags common,mlstack,thread_env,ray` (the
selection of tests/integration/test_ray.py, taken from it: core, hpo, distributed and serving from the
wheelhouse), then
--runs times:

- start to joined: every node's provisioner-ray.service stopped, then started on all three at
  once; the seconds from the start until the head's GCS lists three live nodes (a driver on the
  head, Ray imported before the start, connecting and polling ray.nodes() every 0.2 s);
- distributed trials: `provisioner smoke --cluster` (the hpo workload's study, one CPU per
  trial), its trials/min on every node, the same trials on the head alone, and their ratio.

Prints medians (and the spread of the runs). A correctness figure, not a speedup: the three
servers share this machine's two cores, so three nodes cannot run more trials per minute than
one; what the run shows is that every trial ran, on every node, single-threaded.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from provisioner import bundle, lab

CLI = [sys.executable, "-c", "from provisioner.cli import main; main()"]
HEAD, WORKERS = "ray-bench-h", ("ray-bench-w1", "ray-bench-w2")
NAMES = (HEAD, *WORKERS)
# The cluster's selection is the integration test's own, so the figures are of what it proves.
_spec = importlib.util.spec_from_file_location("test_ray", Path(__file__).resolve().parents[1] / "tests/integration/test_ray.py")
assert _spec is not None and _spec.loader is not None
_test_ray = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_test_ray)
COMPONENTS, selection = _test_ray.COMPONENTS, _test_ray.selection

# On the head as the ML user: Ray imported first (its import takes seconds on a loaded machine
# and is no part of the cluster's start), then "ready"; on a line from stdin (the units were
# started) it connects as soon as the head's GCS answers and prints the epoch time at which N
# nodes were alive (every lab server shares this machine's clock).
WAIT = r"""
import json, sys, time
import ray
cfg = json.load(open("/etc/provisioner/ray/ray.json"))
want = int(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
deadline = time.time() + 300
while True:
    try:
        ray.init(address=cfg["address"], _node_ip_address=cfg["node_address"], logging_level="ERROR", log_to_driver=False)
        break
    except Exception:
        if time.time() > deadline:
            raise
        time.sleep(0.2)
while len([n for n in ray.nodes() if n["Alive"]]) != want and time.time() < deadline:
    time.sleep(0.2)
joined = time.time()
print(json.dumps({"joined": joined, "alive": len([n for n in ray.nodes() if n["Alive"]])}))
"""


def cli_json(*args: str) -> tuple[int, dict]:
    r = subprocess.run([*CLI, *args, "--json"], capture_output=True, text=True, timeout=3600)
    envelope = json.loads(r.stdout)
    return r.returncode, envelope


def ssh(server: lab.LabServer, command: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-F", str(server.ssh_config), server.name, command], capture_output=True, text=True, timeout=timeout, check=False
    )


def join_seconds(servers: dict[str, lab.LabServer]) -> float:
    with ThreadPoolExecutor(len(servers)) as pool:
        list(pool.map(lambda s: ssh(s, "systemctl stop provisioner-ray.service"), servers.values()))
    head = servers[HEAD]
    command = shlex.join(["runuser", "-u", "ml", "--", "/opt/mlstack/bin/python", "-c", WAIT, str(len(servers))])
    waiter = subprocess.Popen(
        ["ssh", "-F", str(head.ssh_config), head.name, command],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert waiter.stdin is not None and waiter.stdout is not None
    if waiter.stdout.readline().strip() != "ready":
        raise SystemExit(f"the waiting driver did not start: {waiter.communicate(timeout=60)[1].strip()[-500:]}")
    started = time.time()
    with ThreadPoolExecutor(len(servers)) as pool:
        list(pool.map(lambda s: ssh(s, "systemctl start provisioner-ray.service"), servers.values()))
    out, err = waiter.communicate("go\n", timeout=600)
    if waiter.returncode != 0:
        raise SystemExit(f"the cluster did not come back: {err.strip().splitlines()[-1:]}")
    result = json.loads(out.strip().splitlines()[-1])
    if result["alive"] != len(servers):
        raise SystemExit(f"only {result['alive']} of {len(servers)} nodes joined within 300 s")
    return result["joined"] - started


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} (runs: {', '.join(f'{v:.1f}' for v in values)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the lab servers up")
    args = parser.parse_args()
    wheelhouse = str(bundle.build_wheelhouse(bundle.default_wheelhouse(), COMPONENTS).path)
    with ThreadPoolExecutor(len(NAMES)) as pool:
        servers = dict(zip(NAMES, pool.map(lab.up, NAMES), strict=True))
    try:
        hosts: dict = {}
        for server in servers.values():
            hosts.update(yaml.safe_load(server.inventory.read_text())["all"]["children"]["lab"]["hosts"])
        inventory = Path(f"/tmp/{HEAD}-hosts.yml")
        groups = {"ray_head": {"hosts": {HEAD: hosts[HEAD]}}, "ray_workers": {"hosts": {w: hosts[w] for w in WORKERS}}}
        inventory.write_text(yaml.safe_dump({"all": {"children": groups}}, sort_keys=False))
        t0 = time.monotonic()
        rc, envelope = cli_json("up", "-i", str(inventory), *selection(wheelhouse))
        if rc != 0:
            raise SystemExit(f"up failed ({rc}): {envelope['errors']}")
        print(
            f"first up of the 3 servers (common, mlstack {'+'.join(COMPONENTS)}, thread_env, ray): {time.monotonic() - t0:.0f} s",
            flush=True,
        )
        joins, cluster, head, ratios = [], [], [], []
        for i in range(args.runs):
            joins.append(join_seconds(servers))
            rc, envelope = cli_json("smoke", "--cluster", "-i", str(inventory))
            check = next(c for c in envelope["data"]["hosts"][HEAD]["checks"] if c["id"] == "cluster.trials")
            # Correctness decides: a lost trial, an idle node or a trial on more threads than it
            # reserved fails; a warning is the rate's (below the previous run on a busy machine).
            if check["status"] not in ("pass", "warn") or "every trial ran, on every node" not in check["reason"]:
                raise SystemExit(f"smoke --cluster run {i + 1}: {check['status']}: {check['reason']}")
            cluster.append(check["figure"])
            head.append(check["limit"])
            ratios.append(check["figure"] / check["limit"])
            print(f"run {i + 1}: joined in {joins[-1]:.1f} s; {check['status']}: {check['reason']}", flush=True)
        print(f"\nmedians of {args.runs} runs on 3 lab servers sharing 2 cores:")
        print(f"  cluster start to all 3 nodes joined: {spread(joins)} s")
        print(f"  distributed trials, every node:      {spread(cluster)} trials/min")
        print(f"  the same trials, the head alone:     {spread(head)} trials/min")
        print(f"  ratio cluster / head alone:          {statistics.median(ratios):.2f}")
    finally:
        if not args.keep:
            for name in NAMES:
                lab.down(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
