"""`provisioner up` on a fleet of four lab servers at once, over real SSH.

The runs apply roles common, storage and hugepages only (`--tags`), so without the ML
environment, the model server, the smoke test (a tagged run has none) and verify
(`--no-verify`). What is proven here is fleet behaviour: every host converged in one run, a
second run changing nothing on any of them, a rolling run stopping at its failure threshold,
an unreachable host dropping out while the others finish. None of it depends on which roles
run, and the roles themselves are proven elsewhere (tests/integration/test_up.py, the molecule
scenarios). The cost decides: `--skip-tags mlstack,serving` (every other role, 350 tasks and
four package installs per host) took 5 min for the first run alone on four servers sharing
this machine's two cores; the ML install would add minutes more. The four servers boot in
parallel and are shared by every test of this module.
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
NAMES = ("flt-1", "flt-2", "flt-3", "flt-4")
# Three plays after the input check (see the docstring for why no more).
SELECTION = ("--tags", "common,storage,hugepages", "--no-verify")


def cli_json(*args: str) -> tuple[int, dict, list[str]]:
    """The exit code, the command's data and its errors, from the JSON envelope."""
    r = subprocess.run([str(BIN), *args, "--json"], capture_output=True, text=True, timeout=900)
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
    """Four lab servers booted in parallel, one inventory with all of them (in NAMES order),
    the first `up` and the second one."""
    with ThreadPoolExecutor(len(NAMES)) as pool:
        servers = list(pool.map(lab.up, NAMES))
    try:
        hosts = {}
        for server in servers:
            inv = yaml.safe_load(server.inventory.read_text())
            hosts.update(inv["all"]["children"]["lab"]["hosts"])
        inventory = tmp_path_factory.mktemp("fleet") / "hosts.yml"
        inventory.write_text(yaml.safe_dump({"all": {"children": {"fleet": {"hosts": hosts}}}}, sort_keys=False))
        first = cli_json("up", "-i", str(inventory), *SELECTION)
        second = cli_json("up", "-i", str(inventory), *SELECTION)
        yield {"servers": dict(zip(NAMES, servers, strict=True)), "inventory": str(inventory), "first": first, "second": second}
    finally:
        for name in NAMES:
            lab.down(name)


def test_one_run_converges_every_host_and_a_second_changes_nothing(fleet):
    rc, first, errors = fleet["first"]
    assert rc == ExitCode.OK, errors
    assert first["summary"]["hosts"] == len(NAMES)
    assert all(first["hosts"][n]["changed"] > 0 and first["hosts"][n]["failed"] == 0 for n in NAMES), first["hosts"]
    rc, second, errors = fleet["second"]
    assert rc == ExitCode.OK, errors
    assert {n: h["changed"] for n, h in second["hosts"].items()} == dict.fromkeys(NAMES, 0)
    assert second["summary"] == {**dict.fromkeys(second["summary"], 0), "hosts": 4, "ok": 4}


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
    assert out["batch"] == {"fleet": 4, "hosts_per_batch": 1, "max_fail_percentage": 0}
    assert statuses(out) == {"flt-1": "failed", "flt-2": "not reached", "flt-3": "not reached", "flt-4": "not reached"}
    assert next(iter(out["hosts"])) == "flt-1", "failures first"
    assert [e for e in errors if e.startswith("flt-1: ")], errors


def test_bad_batch_sizes_are_refused_before_any_host_is_touched(fleet):
    for value, named in (("0", "--batch 0"), ("5", "--batch 5"), ("120%", "--batch 120%"), ("two", "--batch 'two'")):
        rc, out, errors = cli_json("up", "-i", fleet["inventory"], *SELECTION, "--batch", value)
        assert rc == ExitCode.BAD_INPUT and out is None, (value, errors)
        assert len(errors) == 1 and errors[0].startswith(named), errors


def test_an_unreachable_host_drops_out_and_the_others_finish(fleet):
    """Last: flt-4 goes down for good. The three others run every play (changed=0), the run
    ends with exit 3 and names the unreachable host."""
    lab.down("flt-4")
    rc, out, errors = cli_json("up", "-i", fleet["inventory"], *SELECTION)
    assert rc == ExitCode.UNREACHABLE, errors
    assert statuses(out) == {"flt-4": "unreachable", "flt-1": "ok", "flt-2": "ok", "flt-3": "ok"}
    assert next(iter(out["hosts"])) == "flt-4", "failures first"
    assert all(out["hosts"][n]["changed"] == 0 for n in ("flt-1", "flt-2", "flt-3")), out["hosts"]
    assert [e for e in errors if e.startswith("flt-4: unreachable")], errors
