"""`provisioner up` on a fleet of three lab servers at once, over real SSH.

The module's runs apply roles common, storage and hugepages (`--tags`): the fleet mechanics do
not depend on which roles run, and every role's whole run is proven on one server by
tests/integration/test_up.py (a fresh server, the default options and strategy). The first run verifies every host; the second,
the same run without verify, must change nothing on any host. The later tests prove a rolling
run stopping at its failure threshold, bad batch sizes refused, and an unreachable host dropping
out while the others finish. The three servers boot in parallel and are shared by every test of
this module.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from provisioner import lab
from provisioner.errors import ExitCode

pytestmark = pytest.mark.lab

BIN = Path(sys.executable).parent / "provisioner"
NAMES = ("flt-1", "flt-2", "flt-3")
# Every run of the module: three role plays after the input check (see the docstring), role
# common without its base packages (their install is test_up's; dpkg's database is still read,
# which the rolling failure below breaks on purpose).
ROLES = ("--tags", "common,storage,hugepages", "-e", "common_packages=[]")
SELECTION = (*ROLES, "--no-verify")


def cli_json(*args: str, timeout: int = 900) -> tuple[int, dict, list[str]]:
    """The exit code, the command's data and its errors, from the JSON envelope."""
    r = subprocess.run([str(BIN), *args, "--json"], capture_output=True, text=True, timeout=timeout)
    assert r.stdout.strip(), f"no JSON on stdout; stderr: {r.stderr}"
    envelope = json.loads(r.stdout)
    assert envelope["exit_code"] == r.returncode, envelope
    return r.returncode, envelope["data"], envelope["errors"]


def ssh(server: lab.LabServer, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-F", str(server.ssh_config), server.name, command], capture_output=True, text=True, timeout=60)


def statuses(data: dict) -> dict[str, str]:
    return {name: h["status"] for name, h in data["hosts"].items()}


@pytest.fixture(scope="module")
def fleet(lab_requirements, tmp_path_factory):
    """Three lab servers booted in parallel, one inventory with all of them (in NAMES order),
    the first run (with verify) and the second one."""
    try:
        with ThreadPoolExecutor(len(NAMES)) as pool:
            servers = list(pool.map(lab.up, NAMES))
        hosts = {}
        for server in servers:
            inv = yaml.safe_load(server.inventory.read_text())
            hosts.update(inv["all"]["children"]["lab"]["hosts"])
        inventory = tmp_path_factory.mktemp("fleet") / "hosts.yml"
        inventory.write_text(yaml.safe_dump({"all": {"children": {"fleet": {"hosts": hosts}}}}, sort_keys=False))
        # Timeouts guard against a hung run, they are no speed limit.
        first = cli_json("up", "-i", str(inventory), *ROLES, timeout=1800)
        second = cli_json("up", "-i", str(inventory), *SELECTION, timeout=1200)
        yield {"servers": dict(zip(NAMES, servers, strict=True)), "inventory": str(inventory), "first": first, "second": second}
    finally:
        for name in NAMES:
            lab.down(name)


def test_one_run_converges_every_host_and_a_second_changes_nothing(fleet):
    rc, first, errors = fleet["first"]
    assert rc == ExitCode.OK, errors
    assert first["summary"]["hosts"] == len(NAMES)
    assert all(first["hosts"][n]["changed"] > 0 and first["hosts"][n]["failed"] == 0 for n in NAMES), first["hosts"]
    # verify ran each selected role's checks on every host, and only theirs.
    for name in NAMES:
        checks = first["verify"]["hosts"][name]
        assert [c for c in checks if c["outcome"] not in ("passed", "skipped")] == [], (name, checks)
        passed = {c["check"].split("[", 1)[0] for c in checks if c["outcome"] == "passed"}
        assert {"test_ml_user_is_unprivileged", "test_nothing_created_without_a_count", "test_nothing_created_without_devices"} <= passed, (name, passed)
        assert not any("doctor" in c or "metrics" in c for c in passed), (name, passed)
    assert first["verify"]["exit_code"] == ExitCode.OK
    rc, second, errors = fleet["second"]
    assert rc == ExitCode.OK, errors
    assert {n: h["changed"] for n, h in second["hosts"].items()} == dict.fromkeys(NAMES, 0)
    assert second["summary"] == {**dict.fromkeys(second["summary"], 0), "hosts": len(NAMES), "ok": len(NAMES)}


def test_a_rolling_run_stops_at_its_failure_threshold(fleet):
    """flt-1 (first in the inventory, so alone in the first batch) cannot read dpkg's database:
    its common play fails, more than 0% of the batch failed, and no later batch starts."""
    broken = fleet["servers"]["flt-1"]
    assert ssh(broken, "chmod 0 /usr/bin/dpkg-query").returncode == 0
    try:
        rc, out, errors = cli_json("up", "-i", fleet["inventory"], *SELECTION, "--batch", "1", "--max-fail", "0%")
    finally:
        assert ssh(broken, "chmod 0755 /usr/bin/dpkg-query").returncode == 0
    assert rc == ExitCode.HOST_FAILED, errors
    assert out["batch"] == {"fleet": 3, "hosts_per_batch": 1, "max_fail_percentage": 0}
    assert statuses(out) == {"flt-1": "failed", "flt-2": "not reached", "flt-3": "not reached"}
    assert next(iter(out["hosts"])) == "flt-1", "failures first"
    assert [e for e in errors if e.startswith("flt-1: ")], errors


def test_bad_batch_sizes_are_refused_before_any_host_is_touched(fleet):
    for value, named in (("0", "--batch 0"), ("4", "--batch 4"), ("120%", "--batch 120%"), ("two", "--batch 'two'")):
        rc, out, errors = cli_json("up", "-i", fleet["inventory"], *SELECTION, "--batch", value)
        assert rc == ExitCode.BAD_INPUT and out is None, (value, errors)
        assert len(errors) == 1 and errors[0].startswith(named), errors


def test_an_unreachable_host_drops_out_and_the_others_finish(fleet):
    """Last: flt-3 goes down for good. The two others run every play (changed=0), the run
    ends with exit 3 and names the unreachable host."""
    lab.down("flt-3")
    rc, out, errors = cli_json("up", "-i", fleet["inventory"], *SELECTION)
    assert rc == ExitCode.UNREACHABLE, errors
    assert statuses(out) == {"flt-3": "unreachable", "flt-1": "ok", "flt-2": "ok"}, (statuses(out), errors)
    assert next(iter(out["hosts"])) == "flt-3", "failures first"
    assert all(out["hosts"][n]["changed"] == 0 for n in ("flt-1", "flt-2")), out["hosts"]
    assert [e for e in errors if e.startswith("flt-3: unreachable")], errors
