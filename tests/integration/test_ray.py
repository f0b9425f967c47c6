"""A Ray cluster of two lab servers (a head and one worker) set up by role ray over real SSH,
and a third lab server outside the cluster, never provisioned.

The runs apply common, mlstack (core, hpo, distributed and serving from a wheelhouse: serving brings
prometheus-client, with which Ray's autoscaler monitor and dashboard serve metrics, as in an
environment of the default components), thread_env (whose thread variables the Ray units must
clear) and ray only (`--tags`, no verify). Proven here: every node joins with the plan's CPUs and
memory, a job's tasks run on every node with the threads their reservation gives, a stopped worker
leaves and rejoins when started again, a killed one is restarted by systemd and rejoins, the
dashboard (when the environment has it) answers on loopback only, every port the head and a worker
listen on (read with `ss` on the node, not only the planned ones) is refused to the outsider and to
this machine and open to a member, a second run of role ray changes nothing, verify's ray checks pass on every
node and name a stopped unit, `provisioner smoke --cluster` passes with the outsider in the
inventory (left out and named), bad input is refused before any host changes, and role ray's undo
takes it all away (verify's check of a host outside the cluster then passes on the head). The three
servers boot in parallel and are shared by every test of this module.

One worker is enough: every worker runs the same tasks of the role, so a second one re-proved what
the first proves (joining with the plan's sizing, tasks and their threads, its ports fenced and
open, stop, kill and rejoin) at the cost of one more ML stack install on the two shared cores.
What needs two nodes (a task on each, traffic between members, the firewall's list of members,
a node leaving and rejoining a running cluster) is proven with the head and the worker.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from provisioner import bundle, lab
from provisioner.errors import ExitCode

pytestmark = pytest.mark.lab

BIN = Path(sys.executable).parent / "provisioner"
HEAD, WORKERS = "ry-h", ("ry-w1",)
NAMES = (HEAD, *WORKERS)
# A lab server outside the cluster, in the same lab network: booted only, never provisioned.
OUTSIDER = "ry-out"
COMPONENTS = ["core", "hpo", "distributed", "serving"]
PORT = 6379


def selection(wheelhouse: str, tags: str = "common,mlstack,thread_env,ray") -> tuple[str, ...]:
    return (
        "--tags",
        tags,
        "--no-verify",
        "-e",
        f"mlstack_wheelhouse={wheelhouse}",
        "-e",
        f"mlstack_components=[{','.join(COMPONENTS)}]",
    )


def cli_json(*args: str, timeout: int = 1500, with_messages: bool = False) -> tuple:
    r = subprocess.run([str(BIN), *args, "--json"], capture_output=True, text=True, timeout=timeout)
    assert r.stdout.strip(), f"no JSON on stdout; stderr: {r.stderr}"
    envelope = json.loads(r.stdout)
    assert envelope["exit_code"] == r.returncode, envelope
    if with_messages:
        return r.returncode, envelope["data"], envelope["errors"], envelope["messages"]
    return r.returncode, envelope["data"], envelope["errors"]


def ssh(server: lab.LabServer, command: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-F", str(server.ssh_config), server.name, command], capture_output=True, text=True, timeout=timeout
    )


# Run on the head as the ML user: a driver of its own (a job) that prints one JSON line.
DRIVER = r"""
import json, os, sys, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
cfg = json.load(open("/etc/provisioner/ray/ray.json"))
what, args = sys.argv[1], sys.argv[2:]
ray.init(address=cfg["address"], _node_ip_address=cfg["node_address"], logging_level="ERROR", log_to_driver=False)

def alive():
    return [n for n in ray.nodes() if n["Alive"]]

def threads():
    import numpy, sklearn.ensemble  # OpenBLAS and scikit-learn's OpenMP, loaded inside the task
    from threadpoolctl import threadpool_info
    pools = {p["user_api"]: p["num_threads"] for p in threadpool_info()}
    return {"node": ray.get_runtime_context().get_node_id(), "omp": os.environ.get("OMP_NUM_THREADS"),
            "blas": pools.get("blas"), "openmp": pools.get("openmp")}

if what == "nodes":
    print(json.dumps(alive()))
elif what == "wait":  # wait until exactly N nodes are alive
    want, deadline = int(args[0]), time.time() + float(args[1])
    while len(alive()) != want and time.time() < deadline:
        time.sleep(1)
    print(json.dumps(alive()))
elif what == "rejoin":  # wait until node NAME is alive again under a new id, the old one gone
    name, old, deadline = args[0], args[1], time.time() + float(args[2])
    def done():
        live = {n["NodeID"]: n["NodeName"] for n in alive()}
        return old not in live and name in live.values()
    while not done() and time.time() < deadline:
        time.sleep(1)
    print(json.dumps(alive()))
elif what == "threads":  # tasks reserving N CPUs: spread over the cluster, or one on each node
    cpus = int(args[0])
    task = ray.remote(num_cpus=cpus)(threads)
    if cpus == 1:
        refs = [task.options(scheduling_strategy="SPREAD").remote() for _ in range(12)]
    else:
        refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
                for n in alive()]
    names = {n["NodeID"]: n["NodeName"] for n in alive()}
    print(json.dumps([{**r, "node": names[r["node"]]} for r in ray.get(refs)]))
"""


def driver(head: lab.LabServer, *args: str, timeout: int = 180):
    command = shlex.join(["runuser", "-u", "ml", "--", "/opt/mlstack/bin/python", "-c", DRIVER, *args])
    r = ssh(head, command, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    # Ray's driver logs to stdout too (e.g. "[repeated 3x across cluster]" after a worker
    # restarted): the result is the last line that is JSON.
    results = [line for line in r.stdout.splitlines() if line.startswith(("[", "{")) and not line.startswith("[repeated")]
    assert results, f"the driver printed no result: {r.stdout[-3000:]}"
    return json.loads(results[-1])


def verify_ray(inventory: str, limit: str | None = None) -> dict:
    """provisioner verify's checks of role ray (checks/test_ray.py), as `up --tags ray` runs them:
    the verify result as --json gives it. In a process of its own (verify runs pytest)."""
    code = (
        "import json, sys; from pathlib import Path; from provisioner.verify import verify; "
        "print(json.dumps(verify(Path(sys.argv[1]), limit=sys.argv[2] or None, roles=('ray',)).to_dict()))"
    )
    r = subprocess.run([sys.executable, "-c", code, inventory, limit or ""], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def read_json(server: lab.LabServer, path: str) -> dict:
    r = ssh(server, f"cat {shlex.quote(path)}")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def connects(address: str, port: int) -> bool | str:
    """True when a TCP connection from this machine is accepted, else the error."""
    try:
        with socket.create_connection((address, port), timeout=5):
            return True
    except OSError as exc:
        return type(exc).__name__


def write_inventory(path: Path, hosts: dict, head: list[str], workers: list[str], others: tuple[str, ...] = ()) -> str:
    groups = {"ray_head": {"hosts": {h: hosts[h] for h in head}}, "ray_workers": {"hosts": {h: hosts[h] for h in workers}}}
    if others:
        groups["lab"] = {"hosts": {h: hosts[h] for h in others}}
    path.write_text(yaml.safe_dump({"all": {"children": groups}}, sort_keys=False))
    return str(path)


# Run on a lab server: a TCP connection to each ADDRESS:PORT, "open" when accepted, else the error.
PROBE = r"""
import json, socket, sys
out = {}
for target in sys.argv[1:]:
    address, port = target.rsplit(":", 1)
    try:
        with socket.create_connection((address, int(port)), timeout=5):
            out[target] = "open"
    except OSError as exc:
        out[target] = type(exc).__name__
print(json.dumps(out))
"""


def probe(source: lab.LabServer, address: str, ports: list[int]) -> dict[int, str]:
    r = ssh(source, shlex.join(["python3", "-c", PROBE, *(f"{address}:{p}" for p in ports)]))
    assert r.returncode == 0, r.stderr
    return {int(k.rsplit(":", 1)[1]): v for k, v in json.loads(r.stdout).items()}


def listening(server: lab.LabServer) -> dict[int, tuple[set[str], set[str]]]:
    """Every TCP port the server listens on: its addresses and the processes (ss -ltnp on the node)."""
    r = ssh(server, "ss -Hltnp")
    assert r.returncode == 0, r.stderr
    out: dict[int, tuple[set[str], set[str]]] = {}
    for line in r.stdout.splitlines():
        fields = line.split()
        address, _, port = fields[3].rpartition(":")
        addresses, processes = out.setdefault(int(port), (set(), set()))
        addresses.add(address.strip("[]"))
        processes.update(re.findall(r'\("([^"]+)",pid=', line))
    return out


@pytest.fixture(scope="module")
def cluster(lab_requirements, tmp_path_factory):
    """Three lab servers booted in parallel, ry-h in ray_head, ry-w1 in ray_workers and ry-out in
    neither; the check run, the first `up` and the second one."""
    wheelhouse = str(bundle.build_wheelhouse(bundle.default_wheelhouse(), COMPONENTS).path)
    with ThreadPoolExecutor(len(NAMES) + 1) as pool:
        booted = dict(zip((*NAMES, OUTSIDER), pool.map(lab.up, (*NAMES, OUTSIDER)), strict=True))
    outsider = booted.pop(OUTSIDER)
    servers = booted
    try:
        hosts: dict = {}
        for server in (*servers.values(), outsider):
            hosts.update(yaml.safe_load(server.inventory.read_text())["all"]["children"]["lab"]["hosts"])
        where = tmp_path_factory.mktemp("ray")
        inventory = write_inventory(where / "hosts.yml", hosts, [HEAD], list(WORKERS))
        # The documented inventory with one more host, in neither group (what smoke --cluster gets).
        with_outsider = write_inventory(where / "with-outsider.yml", hosts, [HEAD], list(WORKERS), (OUTSIDER,))
        # The check run leaves out common's base packages: check mode on them is test_up.py's.
        check = cli_json("up", "-i", inventory, "--check", *selection(wheelhouse), "-e", "common_packages=[]")
        unit_after_check = [ssh(s, "test -e /etc/systemd/system/provisioner-ray.service").returncode for s in servers.values()]
        first = cli_json("up", "-i", inventory, *selection(wheelhouse))
        # Role ray's second run (with mlstack's tasks it includes): the other roles' second run
        # changing nothing is test_up.py's.
        second = cli_json("up", "-i", inventory, *selection(wheelhouse, "ray"))
        yield {
            "check": (*check, unit_after_check),
            "servers": servers,
            "outsider": outsider,
            "hosts": hosts,
            "inventory": inventory,
            "with_outsider": with_outsider,
            "dir": where,
            "wheelhouse": wheelhouse,
            "first": first,
            "second": second,
        }
    finally:
        for name in (*NAMES, OUTSIDER):
            lab.down(name)


def test_a_check_run_on_fresh_servers_shows_changes_and_makes_none(cluster):
    rc, data, errors, unit_after_check = cluster["check"]
    assert rc == ExitCode.OK, errors
    assert data["check"] is True and all(data["hosts"][n]["changed"] > 0 for n in NAMES), data["hosts"]
    assert unit_after_check == [1] * len(NAMES), "check mode wrote the Ray unit"


def test_one_run_starts_the_cluster_and_a_second_changes_nothing(cluster):
    rc, first, errors = cluster["first"]
    assert rc == ExitCode.OK, errors
    assert all(first["hosts"][n]["changed"] > 0 and first["hosts"][n]["failed"] == 0 for n in NAMES), first["hosts"]
    rc, second, errors = cluster["second"]
    assert rc == ExitCode.OK, errors
    assert {n: h["changed"] for n, h in second["hosts"].items()} == dict.fromkeys(NAMES, 0)


def test_every_node_joins_with_the_planned_cpus_and_memory(cluster):
    servers = cluster["servers"]
    nodes = {n["NodeName"]: n for n in driver(servers[HEAD], "wait", str(len(NAMES)), "120")}
    assert set(nodes) == set(NAMES)
    for name, server in servers.items():
        plan = read_json(server, "/etc/provisioner/plan.json")["values"]
        config = read_json(server, "/etc/provisioner/ray/ray.json")
        resources = nodes[name]["Resources"]
        assert nodes[name]["NodeManagerAddress"] == server.address
        assert resources["CPU"] == plan["ray_num_cpus"] == config["num_cpus"]
        assert abs(resources["memory"] - plan["ray_memory_bytes"]) < 2**20, (resources, plan)
        # The plan's store, capped at 90% of /dev/shm (a lab server's /dev/shm is small).
        assert config["object_store_planned_bytes"] == plan["ray_object_store_bytes"]
        assert config["object_store_bytes"] <= plan["ray_object_store_bytes"]
        assert abs(resources["object_store_memory"] - config["object_store_bytes"]) < 2**20, (resources, config)
        assert config["node"] == ("head" if name == HEAD else "worker")


def test_verify_passes_on_every_node_of_the_cluster(cluster):
    """The role's checks: units, the pinned environment, the node alive with the planned sizing as
    Ray reports it, the ports, the firewall's members, the dashboard, the spill directory."""
    result = verify_ray(cluster["inventory"])
    assert result["exit_code"] == ExitCode.OK, result["roles"]
    assert {h: r["ray"]["outcome"] for h, r in result["roles"].items()} == dict.fromkeys(NAMES, "passed"), result["roles"]
    for name in NAMES:
        outcomes = {c["check"]: c["outcome"] for c in result["hosts"][name]}
        # A member: only the check of a host outside the cluster skips.
        assert {c for c, o in outcomes.items() if o != "passed"} == {"test_nothing_of_the_role_exists_outside_the_cluster"}
        assert len(outcomes) >= 8, outcomes


def test_tasks_run_on_every_node_with_the_threads_of_their_reservation(cluster):
    """thread_env sets OMP_NUM_THREADS to every core for services; the Ray units clear it, so Ray
    gives each task its reservation and OpenBLAS and OpenMP run that many threads."""
    head = cluster["servers"][HEAD]
    service_env = ssh(head, "systemctl show-environment; cat /etc/systemd/system.conf.d/60-provisioner-threads.conf")
    assert "OMP_NUM_THREADS=2" in service_env.stdout, service_env.stdout
    one = driver(head, "threads", "1")
    assert {r["node"] for r in one} == set(NAMES), one
    assert {(r["omp"], r["blas"], r["openmp"]) for r in one} == {("1", 1, 1)}, one
    two = driver(head, "threads", "2")
    assert sorted(r["node"] for r in two) == sorted(NAMES)
    assert {(r["omp"], r["blas"], r["openmp"]) for r in two} == {("2", 2, 2)}, two


def test_every_port_a_node_listens_on_is_refused_outside_the_cluster_and_open_inside(cluster):
    """Not only the planned ports: every TCP port the head and a worker listen on (ss on the node,
    sshd's aside) is probed from the outsider, a lab server in the same network but in neither
    group, and from this machine (10.213.N.1): a TCP reset for each. A member connects to each.
    Ray opens some servers on every address (the GCS, the node manager, the head's metrics servers),
    so the firewall is what fences them; the autoscaler's monitor serves at its planned port, not
    at Ray's 44217, where it answered HTTP 200 to anyone."""
    servers, outsider = cluster["servers"], cluster["outsider"]
    head, worker = servers[HEAD], servers[WORKERS[0]]
    for node, member in ((head, worker), (worker, head)):
        config = read_json(node, "/etc/provisioner/ray/ray.json")
        ports = listening(node)
        ray = {p: where for p, where in ports.items() if where[1] != {"sshd"}}
        assert not {p for p, (_, procs) in ports.items() if "sshd" in procs} - {22}, ports
        # Ray's own, so the probe cannot pass on a node where Ray does not run.
        wanted = {6380, 6381, 6382} | ({PORT, 6386} if node is head else set())
        assert wanted <= set(ray), f"{node.name} listens on {sorted(ray)}, not on {sorted(wanted - set(ray))}"
        assert 44217 not in ports and 44227 not in ports, sorted(ports)
        low, high = config["worker_ports"]
        unplanned = sorted(p for p in ray if p not in config["ports"] and not low <= p <= high)
        assert not unplanned, f"{node.name}: Ray listens on unplanned ports {unplanned}: {ray}"
        outside = probe(outsider, node.address, sorted(ray))
        assert outside == dict.fromkeys(sorted(ray), "ConnectionRefusedError"), f"from {OUTSIDER}: {outside}"
        here = {p: connects(node.address, p) for p in sorted(ray)}
        assert here == dict.fromkeys(sorted(ray), "ConnectionRefusedError"), f"from this machine: {here}"
        # Beyond loopback, every planned one is open to a member of the cluster (a worker process may
        # have ended since ss listed its port).
        reachable = sorted(p for p, (addresses, _) in ray.items() if addresses - {"127.0.0.1", "::1"} and p in config["ports"])
        inside = probe(member, node.address, reachable)
        assert inside == dict.fromkeys(reachable, "open"), f"from {member.name}: {inside}"
    table = ssh(head, "nft list table inet provisioner_ray")
    assert table.returncode == 0 and all(s.address in table.stdout for s in servers.values()), table.stdout
    assert outsider.address not in table.stdout, table.stdout


def test_the_dashboard_listens_on_no_address_beyond_loopback(cluster):
    """The lock's distributed component is ray[tune], without the dashboard's packages
    (ray[default]): the role starts Ray with --include-dashboard=false, and records that, so
    nothing answers on the dashboard's port, on the cluster address or any other."""
    head = cluster["servers"][HEAD]
    config = read_json(head, "/etc/provisioner/ray/ray.json")
    listeners = ssh(head, "ss -ltnH")
    assert f"{head.address}:8265" not in listeners.stdout and "0.0.0.0:8265" not in listeners.stdout
    assert "*:8265" not in listeners.stdout and "[::]:8265" not in listeners.stdout
    assert connects(head.address, 8265) == "ConnectionRefusedError"
    assert config["dashboard"] is None, config
    assert ":8265" not in listeners.stdout, listeners.stdout


def test_a_stopped_worker_leaves_and_rejoins_and_a_killed_one_is_restarted(cluster):
    """The worker in turn: stopped, it leaves (the head alone stays) and verify names its unit;
    started, it rejoins; killed, systemd restarts it and it rejoins as a new node."""
    servers = cluster["servers"]
    (name,) = WORKERS
    head, worker = servers[HEAD], servers[name]
    assert ssh(worker, "systemctl stop provisioner-ray.service").returncode == 0
    assert {n["NodeName"] for n in driver(head, "wait", str(len(NAMES) - 1), "90")} == set(NAMES) - {name}
    # verify fails on the stopped node, naming its unit (asserted once the node runs again).
    try:
        # A clean stop: Ray's status 1 on SIGTERM is the unit's success, so no failed unit is left.
        shown = ssh(worker, "systemctl show -p ActiveState -p Result provisioner-ray.service").stdout.split()
        state = dict(line.split("=", 1) for line in shown)
        result = verify_ray(cluster["inventory"], limit=name)
    finally:
        assert ssh(worker, "systemctl start provisioner-ray.service").returncode == 0
    assert state == {"ActiveState": "inactive", "Result": "success"}, state
    assert result["exit_code"] == ExitCode.HOST_FAILED and list(result["roles"]) == [name], result["roles"]
    ray = result["roles"][name]["ray"]
    units = next(d for d in ray["details"] if d.startswith("test_the_node_and_its_firewall_units_are_active_and_enabled: "))
    assert ray["outcome"] == "failed" and re.search(r"provisioner-ray\.service is inactive ", units), ray
    assert units.endswith("not active and enabled"), units
    assert {n["NodeName"] for n in driver(head, "wait", str(len(NAMES)), "120")} == set(NAMES)
    # A crash: systemd restarts the node (Restart=always) and it joins again as a new node.
    old = next(n["NodeID"] for n in driver(head, "nodes") if n["NodeName"] == name)
    before = ssh(worker, "systemctl show -p NRestarts --value provisioner-ray.service").stdout.strip()
    assert ssh(worker, "kill -KILL $(systemctl show -p MainPID --value provisioner-ray.service)").returncode == 0
    nodes = driver(head, "rejoin", name, old, "150")
    assert {n["NodeName"] for n in nodes} == set(NAMES) and old not in {n["NodeID"] for n in nodes}, nodes
    after = ssh(worker, "systemctl show -p NRestarts --value provisioner-ray.service").stdout.strip()
    assert int(after) == int(before) + 1


def test_smoke_cluster_runs_the_study_on_every_node_and_leaves_out_a_host_outside_the_cluster(cluster):
    """The documented inventory plus a host in neither group, never provisioned: the run is the
    members' only, says so, and never reaches the outsider (it has no ML environment)."""
    rc, data, errors, messages = cli_json("smoke", "--cluster", "-i", cluster["with_outsider"], with_messages=True)
    assert rc == ExitCode.OK, errors
    left_out = f"smoke --cluster left out {OUTSIDER}: in neither ray_head nor ray_workers, not a member of the Ray cluster"
    assert left_out in messages, messages
    assert OUTSIDER not in data["run"]["hosts"], data["run"]["hosts"]
    assert sorted(data["run"]["hosts"]) == sorted(NAMES), data["run"]["hosts"]
    assert list(data["hosts"]) == [HEAD], "the head drives the run, the workers measure nothing"
    check = next(c for c in data["hosts"][HEAD]["checks"] if c["id"] == "cluster.trials")
    # Correctness decides here: a lost trial, an idle node or a trial on more threads than it
    # reserved fails; a warning is the rate's (a busy host, or below the previous run).
    assert check["status"] in ("pass", "warn") and "every trial ran, on every node" in check["reason"], check
    assert check["figure"] > 0 and check["limit"] > 0
    assert all(name in check["reason"] for name in NAMES), check["reason"]


@pytest.mark.parametrize(
    ("layout", "extra", "named"),
    [
        ("both", (), "ry-w1 is in both ray_head and ray_workers"),
        ("no head", (), "ray_workers has hosts but ray_head has none"),
        ("head", ("-e", "ray_node_address=10.9.9.9"), "ray_node_address 10.9.9.9 is not one of"),
        ("head", ("-e", "ray_dashboard_host=0.0.0.0"), "set ray_dashboard_allow_nonlocal: true"),
    ],
)
def test_bad_input_is_refused_before_any_host_changes(cluster, layout, extra, named):
    hosts = cluster["hosts"]
    head, workers = {
        "both": ([HEAD, WORKERS[0]], list(WORKERS)),
        "no head": ([], list(WORKERS)),
        "head": ([HEAD], list(WORKERS)),
    }[layout]
    inventory = write_inventory(cluster["dir"] / f"bad-{len(extra)}-{layout.replace(' ', '-')}.yml", hosts, head, workers)
    rc, data, errors = cli_json("up", "-i", inventory, "--tags", "ray", "--no-verify", *extra, timeout=600)
    assert rc == ExitCode.BAD_INPUT, errors
    # One line per refused host, each from ray's preflight; the host the problem is about names it.
    assert any(named in e for e in errors) and all(": ray: " in e for e in errors), errors
    assert {h: d["changed"] for h, d in data["hosts"].items()} == dict.fromkeys(data["hosts"], 0), data["hosts"]


def test_undo_stops_the_cluster_and_removes_the_units_and_rules(cluster):
    """Last: the cluster goes. Role ray's undo only (`undo --tags ray`), twice: what is asserted is
    the role's own removal (its units, table, configuration, originals and port); the undo of every
    role, the ML environment included, is proven by tests/integration/test_up.py."""
    rc, _data, errors = cli_json("undo", "-i", cluster["inventory"], "--tags", "ray")
    assert rc == ExitCode.OK, errors
    for server in cluster["servers"].values():
        left = ssh(
            server,
            "systemctl is-active provisioner-ray.service; ls /etc/systemd/system/provisioner-ray*;"
            " nft list table inet provisioner_ray; ls /etc/provisioner/ray /var/lib/provisioner/ray",
        )
        assert left.stdout.split() == ["inactive"], left.stdout + left.stderr
        assert (
            ssh(
                server, "test -e /var/lib/provisioner/originals/ray.json || test -e /etc/provisioner/originals/ray.json"
            ).returncode
            == 1
        )
    assert connects(cluster["servers"][HEAD].address, PORT) == "ConnectionRefusedError"
    # Out of the groups now, the head passes verify's check that nothing of the role exists.
    outside = cluster["dir"] / "outside.yml"
    outside.write_text(yaml.safe_dump({"all": {"children": {"lab": {"hosts": cluster["hosts"]}}}}, sort_keys=False))
    result = verify_ray(str(outside), limit=HEAD)
    assert result["exit_code"] == ExitCode.OK and list(result["hosts"]) == [HEAD], result["roles"]
    passed = [c["check"] for c in result["hosts"][HEAD] if c["outcome"] == "passed"]
    assert passed == ["test_nothing_of_the_role_exists_outside_the_cluster"], result["hosts"][HEAD]
    # Twice is harmless: without the role's record the second does nothing.
    rc, data, errors = cli_json("undo", "-i", cluster["inventory"], "--tags", "ray")
    assert rc == ExitCode.OK, errors
    assert {n: data["hosts"][n]["changed"] for n in NAMES} == dict.fromkeys(NAMES, 0), data["hosts"]
