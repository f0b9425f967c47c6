"""verify's checks of role ray (provisioner/checks/test_ray.py) on what a Ray head shows: the
listeners, nftables table and cluster view below are a lab head's (Ray 2.60, nft 1.0.6). The
checks pass on them as they are, and fail, naming the problem, when one thing is off."""

from __future__ import annotations

import copy
import json
import re
from contextlib import nullcontext
from types import SimpleNamespace

import pytest

from provisioner.checks import test_ray as checks

HEAD, WORKERS = "ray-h", ("ray-w1", "ray-w2")
ADDRESSES = {HEAD: "10.213.3.2", WORKERS[0]: "10.213.4.2", WORKERS[1]: "10.213.2.2"}

SS = """\
LISTEN 0      128    10.213.3.2:6382  0.0.0.0:* users:(("ray::RuntimeEnv",pid=1039,fd=27))
LISTEN 0      128       0.0.0.0:22    0.0.0.0:* users:(("sshd",pid=35,fd=3))
LISTEN 0      4096            *:10661       *:* users:(("ray::_cluster_w",pid=1097,fd=26))
LISTEN 0      4096            *:10387       *:* users:(("python",pid=1235,fd=21))
LISTEN 0      128          [::]:22       [::]:* users:(("sshd",pid=35,fd=4))
LISTEN 0      4096            *:6379        *:* users:(("gcs_server",pid=947,fd=44))
LISTEN 0      4096            *:6380        *:* users:(("raylet",pid=1013,fd=40))
LISTEN 0      4096            *:6381        *:* users:(("raylet",pid=1013,fd=30))
LISTEN 0      5         0.0.0.0:6386  0.0.0.0:* users:(("python3",pid=975,fd=21))
"""
UNIT_PIDS = [938, 947, 975, 1013, 1039, 1097]

_PORTS = {"set": [{"range": [6379, 6387]}, {"range": [10001, 10999]}]}
_DPORT = {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": _PORTS}}
TABLE = {
    "nftables": [
        {"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
        {"table": {"family": "inet", "name": "provisioner_ray", "handle": 2}},
        {"set": {"family": "inet", "name": "members4", "type": "ipv4_addr", "elem": sorted(ADDRESSES.values())}},
        {"set": {"family": "inet", "name": "members6", "type": "ipv6_addr"}},
        {"chain": {"family": "inet", "name": "input", "type": "filter", "hook": "input", "prio": -10, "policy": "accept"}},
        {"rule": {"expr": [{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "lo"}}, {"accept": None}]}},
        {
            "rule": {
                "expr": [
                    _DPORT,
                    {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "@members4"}},
                    {"accept": None},
                ]
            }
        },
        {
            "rule": {
                "expr": [
                    _DPORT,
                    {"match": {"op": "==", "left": {"payload": {"protocol": "ip6", "field": "saddr"}}, "right": "@members6"}},
                    {"accept": None},
                ]
            }
        },
        {"rule": {"expr": [_DPORT, {"reject": {"type": "tcp reset"}}]}},
    ]
}


class FakeHost:
    """What testinfra's host gives the checks: command outputs by a piece of the command."""

    def __init__(self, outputs: dict[str, str]) -> None:
        self.outputs = outputs
        self.backend = SimpleNamespace(
            ansible_runner=SimpleNamespace(get_variables=lambda name: {"ansible_host": ADDRESSES[name]})
        )

    def user(self, name: str | None = None) -> SimpleNamespace:
        return SimpleNamespace(uid=0)

    def sudo(self) -> nullcontext:
        return nullcontext()

    def run(self, command: str) -> SimpleNamespace:
        for piece, out in self.outputs.items():
            if piece in command:
                return SimpleNamespace(rc=0, stdout=out, stderr="")
        return SimpleNamespace(rc=1, stdout="", stderr=f"no such command here: {command}")

    def check_output(self, command: str) -> str:
        r = self.run(command)
        assert r.rc == 0, r.stderr
        return str(r.stdout).strip()


def head(ss: str = SS, table: dict | None = None, active: str = "active") -> FakeHost:
    return FakeHost(
        {
            "systemctl show": f"ActiveState={active}\nMainPID={938 if active == 'active' else 0}\n"
            "ControlGroup=/system.slice/provisioner-ray.service\n",
            "grep -lE": "\n".join(f"/proc/{p}/cgroup" for p in UNIT_PIDS),
            "ss -Hltnp": ss,
            "nft -j list table inet provisioner_ray": json.dumps(table or TABLE),
        }
    )


@pytest.fixture()
def member() -> dict:
    return {
        "name": HEAD,
        "node": "head",
        "members": [HEAD, *WORKERS],
        "address": ADDRESSES[HEAD],
        "ray_port": 6379,
        "ray_service_port_base": 6380,
        "ray_client_server_port": 10001,
        "ray_worker_port_min": 10002,
        "ray_worker_port_max": 10999,
        "ray_firewall": True,
        "ray_dashboard_host": "127.0.0.1",
        "ray_dashboard_port": 8265,
        "ray_dashboard_allow_nonlocal": False,
        "config": {"ports": [6379, 6380, 6381, 6382, 6383, 6384, 6385, 6386, 6387, 10001], "dashboard": None},
    }


def test_the_checks_pass_on_a_heads_listeners_and_table(member):
    checks.test_ray_listens_on_the_planned_ports_only(head(), member)
    checks.test_the_firewall_admits_rays_ports_from_the_members_only(head(), member)
    checks.test_the_dashboard_listens_on_no_address_beyond_loopback(head(), member)


@pytest.mark.parametrize(
    ("ss", "named"),
    [
        (SS.replace("*:6379 ", "*:6390 "), "Ray does not listen on [6379]"),  # the GCS elsewhere
        (SS + 'LISTEN 0 4096 *:8000 *:* users:(("raylet",pid=1013,fd=41))\n', "unplanned ports [8000]"),
        # The autoscaler's monitor at Ray's own port, as a unit without AUTOSCALER_METRIC_PORT left it.
        (SS.replace("0.0.0.0:6386 ", "0.0.0.0:44217 "), "unplanned ports [44217]"),
        (SS.replace("10.213.3.2:6382", "0.0.0.0:6382"), "port 6382 is bound to ['0.0.0.0']"),
    ],
)
def test_the_ports_check_names_a_port_off_the_plan(member, ss, named):
    with pytest.raises(AssertionError, match=re.escape(named)):
        checks.test_ray_listens_on_the_planned_ports_only(head(ss=ss), member)


def test_a_listener_of_another_process_is_not_rays(member):
    """A driver (pid 1235, outside the unit) listens on a port of its own: not the node's."""
    checks.test_ray_listens_on_the_planned_ports_only(head(ss=SS.replace("*:10387", "*:7777")), member)


def test_a_stopped_unit_is_named(member):
    with pytest.raises(AssertionError, match=re.escape("provisioner-ray.service is inactive: it runs no process")):
        checks.test_ray_listens_on_the_planned_ports_only(head(active="inactive"), member)


def _table(change) -> dict:
    table = copy.deepcopy(TABLE)
    change(table["nftables"])
    return table


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda t: t[2]["set"]["elem"].append("10.9.9.9"), "the table admits"),
        (lambda t: t.pop(), "then a reset for every other source"),
        (lambda t: t[-1]["rule"]["expr"].__setitem__(-1, {"accept": None}), "then a reset for every other source"),
        (lambda t: t[-2]["rule"]["expr"][0]["match"]["right"]["set"].pop(), "but 10001-10999 (left out) and none"),
    ],
)
def test_the_firewall_check_names_a_table_that_admits_more(member, change, named):
    with pytest.raises(AssertionError, match=re.escape(named)):
        checks.test_the_firewall_admits_rays_ports_from_the_members_only(head(table=_table(change)), member)


def test_a_dashboard_beyond_loopback_fails(member):
    ss = SS + 'LISTEN 0 128 0.0.0.0:8265 0.0.0.0:* users:(("python",pid=980,fd=12))\n'
    with pytest.raises(AssertionError, match=r"the dashboard's port 8265 listens on \['0.0.0.0'\]"):
        checks.test_the_dashboard_listens_on_no_address_beyond_loopback(head(ss=ss), member)
    # On loopback, yet ray.json records no dashboard: not what the role started.
    ss = SS + 'LISTEN 0 128 127.0.0.1:8265 0.0.0.0:* users:(("python",pid=980,fd=12))\n'
    with pytest.raises(AssertionError, match="records no dashboard"):
        checks.test_the_dashboard_listens_on_no_address_beyond_loopback(head(ss=ss), member)


def _view(**resources) -> str:
    """The cluster as the check's driver prints it: this head alive with the given resources."""
    mine = {"CPU": 2.0, "memory": 15165901211.0, "object_store_memory": 2274888499.0, **resources}
    nodes = [
        {"NodeID": "a", "NodeName": HEAD, "NodeManagerAddress": ADDRESSES[HEAD], "Alive": True, "Resources": mine},
        {"NodeID": "b", "NodeName": WORKERS[0], "NodeManagerAddress": ADDRESSES[WORKERS[0]], "Alive": True, "Resources": mine},
    ]
    return json.dumps({"version": "2.60.0", "nodes": nodes})


def sized(view: str) -> FakeHost:
    host = head()
    host.outputs = {"timeout 120 runuser": view, "df --output=size": " 1B-blocks\n2527653888\n", **host.outputs}
    return host


@pytest.fixture()
def planned(member) -> dict:
    member.update(ray_num_cpus=2, ray_memory_bytes=15165901211, ray_object_store_bytes=7582950604, venv="/opt/mlstack")
    member.update(ray_user="ml", config_file="/etc/provisioner/ray/ray.json")
    member["config"].update(address="10.213.3.2:6379", object_store_planned_bytes=7582950604)
    return member


def test_the_sizing_check_holds_rays_view_against_the_plan(planned):
    # The plan's store is above 90% of /dev/shm: Ray's is that 90% (2,274,888,499 bytes).
    checks.test_the_node_is_alive_in_the_cluster_with_the_planned_sizing(sized(_view()), planned)
    with pytest.raises(AssertionError, match=re.escape("Ray's CPUs 4.0, planned 2")):
        checks.test_the_node_is_alive_in_the_cluster_with_the_planned_sizing(sized(_view(CPU=4.0)), planned)
    with pytest.raises(AssertionError, match=re.escape("Ray's object store 7582950604.0, planned 7582950604")):
        checks.test_the_node_is_alive_in_the_cluster_with_the_planned_sizing(
            sized(_view(object_store_memory=7582950604.0)), planned
        )
    gone = _view().replace(f'"NodeName": "{HEAD}"', '"NodeName": "elsewhere"')
    with pytest.raises(AssertionError, match=f"{HEAD} is not alive in the cluster"):
        checks.test_the_node_is_alive_in_the_cluster_with_the_planned_sizing(sized(gone), planned)
