"""Role ray's unit file, rendered from its template: every port Ray is told to open (its options and
the metrics servers' environment variables) is one of the ports the role's firewall admits from the
members only, so none is left at a default of Ray's own that nothing fences (the autoscaler's
monitor served 44217 on every address that way)."""

from __future__ import annotations

import re

import jinja2
import yaml

from provisioner import paths
from provisioner.checks import test_ray as checks

ROLE = paths.ROLES / "ray"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
VARS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())


def _bool(value: object) -> bool:
    return str(value).lower() in ("true", "yes", "1")


def render(context: dict) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"), undefined=jinja2.StrictUndefined)
    env.filters["bool"] = _bool
    return env.get_template("provisioner-ray.service.j2").render(context)


def unit_context(head: bool) -> dict:
    base = DEFAULTS["ray_service_port_base"]
    service = list(range(base, base + checks.SERVICE_PORTS))
    return {
        **{k: v for k, v in DEFAULTS.items() if isinstance(v, (int, str, bool)) and "{{" not in str(v)},
        "_ray_unit": VARS["_ray_unit"],
        "_ray_firewall_unit": VARS["_ray_firewall_unit"],
        "_ray_role": "head" if head else "worker",
        "_ray_is_head": head,
        "_ray_venv": "/opt/mlstack",
        "_ray_bin": "/opt/mlstack/bin/ray",
        "_ray_config": "/etc/provisioner/ray/ray.json",
        "_ray_state_dir": VARS["_ray_state_dir"],
        "_ray_temp_dir": "/var/lib/provisioner/ray/tmp",
        "_ray_spill": "/var/lib/provisioner/ray/spill",
        "_ray_thread_variables": ["OMP_NUM_THREADS"],
        "_ray_service_ports": service,
        "_ray_client": True,
        "_ray_dashboard": True,
        "_ray_cluster_address": "10.0.0.11:6379",
        "_ray_store": 2**30,
        "ray_node_address": "10.0.0.11" if head else "10.0.0.12",
        "ray_user": "ml",
        "ray_num_cpus": 2,
        "ray_memory_bytes": 2**31,
        "inventory_hostname": "box1" if head else "box2",
    }


def test_the_checks_count_the_roles_service_ports():
    assert VARS["_ray_service_ports"].replace(" ", "").endswith(f"+{checks.SERVICE_PORTS})|list}}}}"), VARS["_ray_service_ports"]


def test_every_port_the_unit_names_is_one_the_firewall_admits():
    base = DEFAULTS["ray_service_port_base"]
    admitted = {DEFAULTS["ray_port"], DEFAULTS["ray_client_server_port"], *range(base, base + checks.SERVICE_PORTS)}
    workers = range(DEFAULTS["ray_worker_port_min"], DEFAULTS["ray_worker_port_max"] + 1)
    for head in (True, False):
        unit = render(unit_context(head))
        options = {m[0]: int(m[1]) for m in re.findall(r"--([a-z-]*port)=(\d+)", unit)}
        env = {m[0]: int(m[1]) for m in re.findall(r"\b([A-Z_]+_PORT)=(\d+)", unit)}
        # The head's metrics servers at the last two service ports, not Ray's 44217 and 44227.
        assert env == {"AUTOSCALER_METRIC_PORT": base + 6, "DASHBOARD_METRIC_PORT": base + 7}, env
        told = {**options, **env}
        told.pop("dashboard-port", None)  # the dashboard: loopback only, or explicitly opened
        stray = {k: v for k, v in told.items() if v not in admitted and not (k.endswith("worker-port") and v in workers)}
        assert not stray, f"the unit opens ports the firewall does not admit: {stray}"
        assert len(set(told.values())) == len(told), told
        if head:
            assert {"port", "ray-client-server-port", "node-manager-port", "metrics-export-port"} <= set(options), options
