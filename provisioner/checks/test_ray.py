"""What role ray promises, checked on the target.

On a member of the cluster's groups (ray_head_group, ray_worker_group): the node's unit and its
firewall unit active and enabled, the node running from the ML environment with Ray as the lock
pins it, the node alive in the cluster with the planned CPUs, task memory and object store as Ray
itself reports them (a driver on the host, through the head's GCS), Ray's listening ports the
planned ones, the nftables table admitting Ray's ports from the members' addresses only, the
dashboard on no address beyond loopback (unless ray_dashboard_allow_nonlocal), and the object
store spilling where planned. On a host in neither group: nothing of the role exists.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

import pytest

from provisioner.checks import EXTRA_VARS, as_root, role_constants, role_vars

UNIT, FIREWALL_UNIT, UNIT_DIR, TABLE, STATE_DIR, _LOOPBACK = role_constants(
    "ray", "unit", "firewall_unit", "unit_dir", "nft_table", "state_dir", "loopback"
)
DEFAULT_SPILL = f"{STATE_DIR}/spill"
LOOPBACK = set(_LOOPBACK)
# Ray's object store: the plan's, at most this share of /dev/shm (roles/ray/tasks/configure.yml).
SHM_SHARE = 0.9
# Ray's service ports on a node: ray_service_port_base + 0..7 (roles/ray/vars/main.yml).
SERVICE_PORTS = 8
# Ray reports its resources in its own units (memory rounded): equal within a MiB.
MIB = 2**20

# Run by the ray user with the node's Python: this node as the cluster's GCS lists it, and the
# Ray the driver imported (the version a node must share with every other).
NODES = r"""
import json, sys
import ray
cfg = json.load(open(sys.argv[1]))
ray.init(address=cfg["address"], _node_ip_address=cfg["node_address"], logging_level="ERROR", log_to_driver=False)
nodes = [{k: n.get(k) for k in ("NodeID", "NodeName", "NodeManagerAddress", "Alive", "Resources")} for n in ray.nodes()]
print(json.dumps({"version": ray.__version__, "nodes": nodes}))
"""


def _inventory(host) -> dict[str, Any]:
    try:
        return host.ansible.get_variables()
    except Exception:  # not an ansible:// host: no groups, so no member
        return {}


def _member_address(host, name: str) -> str:
    """A member's cluster address as the role sets it: ray_node_address, else ansible_host."""
    if "ray_node_address" in EXTRA_VARS:
        return str(EXTRA_VARS["ray_node_address"])
    runner = getattr(host.backend, "ansible_runner", None)
    hostvars = runner.get_variables(name) if runner else {}
    address = hostvars.get("ray_node_address")
    if not address or "{{" in str(address):
        address = hostvars.get("ansible_host") or name
    return str(address)


@pytest.fixture()
def cluster(host) -> dict[str, Any]:
    values = role_vars(host, "ray")
    inventory = _inventory(host)
    groups = inventory.get("groups") or {}
    name = inventory.get("inventory_hostname", "")
    heads = list(groups.get(values["ray_head_group"]) or [])
    workers = list(groups.get(values["ray_worker_group"]) or [])
    values.update(
        name=name,
        members=list(dict.fromkeys(heads + workers)),
        node="head" if name in heads else "worker" if name in workers else None,
        config_file=f"{role_vars(host, 'common').get('common_config_dir') or '/etc/provisioner'}/ray/ray.json",
        venv=role_vars(host, "mlstack").get("mlstack_venv") or "/opt/mlstack",
        originals=f"{role_vars(host, 'common').get('common_state_dir') or '/var/lib/provisioner'}/originals/ray.json",
    )
    return values


@pytest.fixture()
def member(host, cluster) -> dict[str, Any]:
    if cluster["node"] is None:
        pytest.skip(f"in neither {cluster['ray_head_group']} nor {cluster['ray_worker_group']}: the role changed nothing here")
    config = host.file(cluster["config_file"])
    assert config.exists, f"{cluster['config_file']} is missing: role ray has not run on this member"
    cluster["config"] = json.loads(config.content_string)
    cluster["address"] = _member_address(host, cluster["name"])
    return cluster


def _show(host, unit: str, *props: str) -> dict[str, str]:
    out = host.check_output(f"systemctl show {shlex.quote(unit)} " + " ".join(f"-p {p}" for p in props))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _unit_pids(host, unit: str) -> list[int]:
    """Every process of the unit (those in its control group), the main process first."""
    props = _show(host, unit, "ActiveState", "MainPID", "ControlGroup")
    main = int(props.get("MainPID") or 0)
    assert main > 0, f"{unit} is {props.get('ActiveState')}: it runs no process"
    # The unified hierarchy's line (0::), or systemd's own on a host with cgroup v1 only.
    pattern = f"^[0-9]+:(name=systemd)?:{re.escape(props['ControlGroup'])}$"
    with as_root(host):
        found = host.run(f"grep -lE {shlex.quote(pattern)} /proc/[0-9]*/cgroup").stdout.split()
    pids = [int(f.split("/")[2]) for f in found]
    return [main, *(p for p in pids if p != main)]


def _processes(host, pids: list[int]) -> dict[int, dict[str, Any]]:
    """Each process's executable, owner and arguments (a process gone meanwhile is left out)."""
    out: dict[int, dict[str, Any]] = {}
    with as_root(host):
        for pid in pids:
            cmdline = host.file(f"/proc/{pid}/cmdline")
            lines = host.run(f"readlink /proc/{pid}/exe && stat -c %u /proc/{pid}").stdout.split()
            if len(lines) == 2:
                out[pid] = {"exe": lines[0], "uid": lines[1], "argv": cmdline.content_string.rstrip("\0").split("\0")}
    return out


def _listeners(host, pids: set[int] | None = None) -> dict[int, set[str]]:
    """Listening TCP ports and their addresses, of the given processes (all when None)."""
    with as_root(host):
        out = host.check_output("ss -Hltnp")
    bound: dict[int, set[str]] = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        owners = {int(part.split(",")[0]) for part in line.split("pid=")[1:]}
        if pids is not None and not owners & pids:
            continue
        address, _, port = fields[3].rpartition(":")
        bound.setdefault(int(port), set()).add(address.strip("[]").split("%")[0])
    return bound


def _expected_store(host, member) -> int:
    shm = int(host.check_output("df --output=size -B1 /dev/shm").split()[-1])
    return min(int(member["ray_object_store_bytes"]), int(shm * SHM_SHARE))


def _expected_spill(host, member) -> str:
    if member["ray_spill_dir"]:
        return str(member["ray_spill_dir"])
    data = str(role_vars(host, "plan").get("plan_data_mountpoint") or "/data").rstrip("/") or "/"
    return f"{data}/ray-spill" if host.run(f"mountpoint -q {shlex.quote(data)}").rc == 0 else DEFAULT_SPILL


def test_nothing_of_the_role_exists_outside_the_cluster(host, cluster):
    if cluster["node"] is not None:
        pytest.skip(f"{cluster['name']} is the cluster's {cluster['node']}")
    config_dir = cluster["config_file"].rsplit("/", 1)[0]
    with as_root(host):
        found = [p for p in (f"{UNIT_DIR}/{UNIT}", f"{UNIT_DIR}/{FIREWALL_UNIT}", config_dir, STATE_DIR) if host.file(p).exists]
        table = host.run(f"nft list table inet {TABLE}")
        recorded = host.file(cluster["originals"]).exists
    assert not found, f"outside the cluster's groups, yet {', '.join(found)} exist"
    assert table.rc != 0, f"outside the cluster's groups, yet the nftables table inet {TABLE} is loaded"
    assert not recorded, f"outside the cluster's groups, yet {cluster['originals']} records a ray run"
    if host.file("/run/systemd/system").is_directory:
        for unit in (UNIT, FIREWALL_UNIT):
            state = _show(host, unit, "LoadState", "ActiveState")
            assert state == {"LoadState": "not-found", "ActiveState": "inactive"}, f"{unit} is known here: {state}"


def test_the_node_and_its_firewall_units_are_active_and_enabled(host, member):
    units = [UNIT, FIREWALL_UNIT] if member["ray_firewall"] else [UNIT]
    for unit in units:
        props = _show(host, unit, "ActiveState", "SubState", "UnitFileState")
        assert (props.get("ActiveState"), props.get("UnitFileState")) == ("active", "enabled"), (
            f"{unit} is {props.get('ActiveState')} ({props.get('SubState')}), {props.get('UnitFileState')}:"
            f" not active and enabled"
        )
    assert member["config"]["node"] == member["node"], f"ray.json says {member['config']['node']}, the inventory {member['node']}"


def test_the_node_runs_from_the_pinned_ml_environment(host, member):
    venv, user = member["venv"], member["ray_user"]
    props = _show(host, UNIT, "User", "ExecStart")
    assert props["User"] == user, f"{UNIT} runs as {props['User']}, not {user}"
    assert f"path={venv}/bin/ray " in props["ExecStart"], props["ExecStart"]
    pids = _unit_pids(host, UNIT)
    procs = _processes(host, pids)
    main = procs[pids[0]]["argv"]
    assert f"{venv}/bin/ray" in main[:2] and "start" in main, f"{UNIT}'s main process is {' '.join(main)}"
    # Ray's own servers (the GCS on the head, the raylet on every node) are binaries of the
    # environment's ray package, and every process of the node runs as the ray user.
    servers = {p["exe"].rsplit("/", 1)[-1]: p["exe"] for p in procs.values() if "/ray/core/src/" in p["exe"]}
    wanted = {"raylet", "gcs_server"} if member["node"] == "head" else {"raylet"}
    assert wanted <= set(servers), f"{UNIT} runs no {' or '.join(sorted(wanted - set(servers)))}: {sorted(servers)}"
    # The kernel names the binaries by their real path: the live generation behind the venv's link.
    real = host.check_output(f"readlink -f {shlex.quote(venv)}")
    assert all(e.startswith(f"{real}/") for e in servers.values()), servers
    uid = str(host.user(user).uid)
    others = {p: " ".join(proc["argv"])[:80] for p, proc in procs.items() if proc["uid"] != uid}
    assert not others, f"{UNIT} has processes not run by {user}: {others}"
    # The pinned Ray: the environment's manifest (role mlstack) pins it, and that version runs.
    manifest = json.loads(host.file(f"{venv}/mlstack.json").content_string)
    pins = [p for p in manifest["pins"] if p.startswith("ray==")]
    assert pins, f"{venv}/mlstack.json pins no ray (component distributed missing)"
    with as_root(host):
        version = host.check_output(
            f"runuser -u {shlex.quote(user)} -- {shlex.quote(venv)}/bin/python -c 'import ray; print(ray.__version__)'"
        )
    assert f"ray=={version.strip()}" == pins[0], f"the environment's Ray is {version.strip()}, the lock pins {pins[0]}"


def test_the_node_is_alive_in_the_cluster_with_the_planned_sizing(host, member):
    config, user = member["config"], member["ray_user"]
    state = _show(host, UNIT, "ActiveState")["ActiveState"]
    assert state == "active", f"{UNIT} is {state}: {member['name']} is not in the cluster"
    command = shlex.join(
        ["timeout", "120", "runuser", "-u", user, "--", f"{member['venv']}/bin/python", "-c", NODES, member["config_file"]]
    )
    with as_root(host):
        r = host.run(command)
    assert r.rc == 0, f"no driver could join the cluster at {config['address']}: {r.stderr.strip()[-500:]}"
    reported = json.loads(r.stdout.strip().splitlines()[-1])
    mine = [n for n in reported["nodes"] if n["Alive"] and n["NodeName"] == member["name"]]
    alive = sorted(n["NodeName"] for n in reported["nodes"] if n["Alive"])
    assert len(mine) == 1, f"{member['name']} is not alive in the cluster at {config['address']} (alive: {alive})"
    node, resources = mine[0], mine[0]["Resources"]
    assert node["NodeManagerAddress"] == member["address"], f"the node is at {node['NodeManagerAddress']}"
    assert config["address"] == f"{_member_address(host, member['members'][0])}:{member['ray_port']}", config["address"]
    assert resources.get("CPU") == member["ray_num_cpus"], f"Ray's CPUs {resources.get('CPU')}, planned {member['ray_num_cpus']}"
    assert not resources.get("GPU"), resources
    memory = member["ray_memory_bytes"]
    assert abs(resources.get("memory", 0) - memory) < MIB, f"Ray's task memory {resources.get('memory')}, planned {memory}"
    store = _expected_store(host, member)
    assert config["object_store_planned_bytes"] == member["ray_object_store_bytes"], config
    assert abs(resources.get("object_store_memory", 0) - store) < MIB, (
        f"Ray's object store {resources.get('object_store_memory')}, planned {member['ray_object_store_bytes']}"
        f" (at most {SHM_SHARE:.0%} of /dev/shm: {store})"
    )


def test_ray_listens_on_the_planned_ports_only(host, member):
    config = member["config"]
    base = int(member["ray_service_port_base"])
    low, high = int(member["ray_worker_port_min"]), int(member["ray_worker_port_max"])
    bound = _listeners(host, set(_unit_pids(host, UNIT)))
    # Every node: its node manager, object manager and runtime-env agent; the head: the GCS.
    wanted = {base, base + 1, base + 2} | ({int(member["ray_port"])} if member["node"] == "head" else set())
    missing = sorted(wanted - set(bound))
    assert not missing, f"Ray does not listen on {missing}: it listens on {sorted(bound)}"
    planned = set(config["ports"]) | {int(member["ray_port"])} | set(range(base, base + SERVICE_PORTS))
    if config.get("dashboard"):
        planned.add(int(member["ray_dashboard_port"]))
    stray = sorted(p for p in bound if p not in planned and not low <= p <= high)
    assert not stray, f"Ray listens on unplanned ports {stray} (planned {sorted(planned)} and {low}-{high})"
    assert config["ports"] == sorted(
        {int(member["ray_port"]), int(member["ray_client_server_port"]), *range(base, base + SERVICE_PORTS)}
    )
    # The runtime-env agent is one of the servers Ray binds to the node's address.
    assert bound[base + 2] <= {member["address"]}, f"port {base + 2} is bound to {sorted(bound[base + 2])}"


def _nft_ports(right: Any) -> set[int]:
    """The ports a rule's dport match names (nft merges adjacent ports into ranges)."""
    items = right.get("set", []) if isinstance(right, dict) else [right]
    out: set[int] = set()
    for item in items:
        if isinstance(item, dict) and "range" in item:
            out.update(range(int(item["range"][0]), int(item["range"][1]) + 1))
        else:
            out.add(int(item))
    return out


def _spans(ports: set[int]) -> str:
    """Ports as the table writes them: 6379-6387, 10001."""
    spans: list[list[int]] = []
    for port in sorted(ports):
        if spans and spans[-1][1] == port - 1:
            spans[-1][1] = port
        else:
            spans.append([port, port])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans) or "none"


def _matched(expr: list[dict[str, Any]], field: str) -> list[Any]:
    """What a rule's matches on a packet field (dport, saddr) compare it with."""
    return [m["match"]["right"] for m in expr if "match" in m and m["match"]["left"].get("payload", {}).get("field") == field]


def test_the_firewall_admits_rays_ports_from_the_members_only(host, member):
    if not member["ray_firewall"]:
        pytest.skip("ray_firewall is false: the role leaves the firewall alone")
    with as_root(host):
        r = host.run(f"nft -j list table inet {TABLE}")
    assert r.rc == 0, f"the nftables table inet {TABLE} is not loaded: {r.stderr.strip()}"
    objects = [o for o in json.loads(r.stdout)["nftables"] if "metainfo" not in o]
    sets = {o["set"]["name"]: o["set"] for o in objects if "set" in o}
    elements = {str(e) for name in ("members4", "members6") for e in sets.get(name, {}).get("elem", [])}
    addresses = {_member_address(host, m) for m in member["members"]}
    assert elements == addresses, f"the table admits {sorted(elements)}, the members are {sorted(addresses)}"
    chains = [o["chain"] for o in objects if "chain" in o]
    assert [(c["hook"], c["policy"]) for c in chains] == [("input", "accept")], chains
    rules = [o["rule"]["expr"] for o in objects if "rule" in o]
    base = int(member["ray_service_port_base"])
    ports = {
        int(member["ray_port"]),
        int(member["ray_client_server_port"]),
        *range(base, base + SERVICE_PORTS),
        *range(int(member["ray_worker_port_min"]), int(member["ray_worker_port_max"]) + 1),
    }
    port_rules = []
    for expr in rules:
        dport = _matched(expr, "dport")
        if dport:
            saddr = _matched(expr, "saddr")
            verdict = "reject" if any("reject" in m for m in expr) else "accept" if any("accept" in m for m in expr) else "?"
            port_rules.append((_nft_ports(dport[0]), saddr[0] if saddr else None, verdict))
    for rule_ports, _, _ in port_rules:
        assert rule_ports == ports, (
            f"a rule of the table covers Ray's ports but {_spans(ports - rule_ports)} (left out)"
            f" and {_spans(rule_ports - ports)} (not Ray's)"
        )
    # The members' sets admitted, then every other source reset: the last rule rejects.
    verdicts = [(s, v) for _, s, v in port_rules]
    assert verdicts == [("@members4", "accept"), ("@members6", "accept"), (None, "reject")], (
        f"the table's rules on Ray's ports are {verdicts}: not the members accepted, then a reset for every other source"
    )


def test_the_dashboard_listens_on_no_address_beyond_loopback(host, member):
    port = int(member["ray_dashboard_port"])
    allowed = set(LOOPBACK) | ({member["ray_dashboard_host"]} if member["ray_dashboard_allow_nonlocal"] else set())
    bound = _listeners(host).get(port, set())
    assert bound <= allowed, f"the dashboard's port {port} listens on {sorted(bound)}, beyond {sorted(allowed)}"
    dashboard = member["config"].get("dashboard")
    if dashboard:
        assert member["node"] == "head" and dashboard == f"http://{member['ray_dashboard_host']}:{port}", dashboard
        assert member["ray_dashboard_host"] in bound or "0.0.0.0" in bound, f"no dashboard on {dashboard}: {sorted(bound)}"
    else:
        assert not bound, f"ray.json records no dashboard, yet port {port} listens on {sorted(bound)}"


def test_the_object_store_spills_where_planned(host, member):
    spill, user = _expected_spill(host, member), member["ray_user"]
    assert member["config"]["spill_dir"] == spill, f"ray.json spills to {member['config']['spill_dir']}, planned {spill}"
    d = host.file(spill)
    assert d.is_directory, f"the spill directory {spill} does not exist"
    assert (d.user, d.group, d.mode) == (user, user, 0o777), f"{spill} is {d.user}:{d.group} {d.mode:04o}, not {user}:{user} 0777"
    exec_start = _show(host, UNIT, "ExecStart")["ExecStart"]
    assert f"--object-spilling-directory={spill} " in exec_start, exec_start
    # The raylet spills there, and falls back there when /dev/shm is full (Ray uses the spill
    # directory for both).
    procs = _processes(host, _unit_pids(host, UNIT))
    raylets = [p["argv"] for p in procs.values() if p["exe"].endswith("/raylet")]
    assert len(raylets) == 1, f"{UNIT} runs {len(raylets)} raylets"
    assert f"--fallback_directory={spill}" in raylets[0], [a for a in raylets[0] if "directory" in a]
