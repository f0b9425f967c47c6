"""Host-level: tune THIS machine over the local connection, check the live kernel, undo.

Lab servers cannot show live vm.*/THP values (read-only in a container), so this test
applies cpu_tuning, hugepages (2M) and thread_env to the machine running the tests,
asserts the live values, runs `provisioner undo` (twice) and asserts every value is back.
Whatever happens, the fixture writes the recorded values back at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.errors import ExitCode

pytestmark = pytest.mark.host

BIN = Path(sys.executable).parent / "provisioner"
KNOBS = {
    "nr_hugepages": Path("/proc/sys/vm/nr_hugepages"),
    "swappiness": Path("/proc/sys/vm/swappiness"),
    "thp_enabled": Path("/sys/kernel/mm/transparent_hugepage/enabled"),
    "thp_defrag": Path("/sys/kernel/mm/transparent_hugepage/defrag"),
}
# mlstack too: on the local connection its tasks run as the ML user, who cannot run the
# control node's own Python (the README's first command goes this way).
ROLES = "plan,common,cpu_tuning,hugepages,thread_env,mlstack"
# Values that differ from any kernel default, so a live change is visible.
OPTIONS = ["-e", "plan_hugepages_size=2M", "-e", "plan_hugepages_count=16", "-e", "plan_thp=always"]


def read(knob: str) -> str:
    text = KNOBS[knob].read_text().strip()
    if "[" in text:  # THP files show the choice in brackets
        return text.split("[", 1)[1].split("]", 1)[0]
    return text


def login_shell(var: str, user: str = "root") -> str:
    cmd = ["env", "-i", "HOME=/root", "bash", "-lc", f"echo ${var}"]
    if user != "root":
        cmd = ["su", "-", user, "-c", f"echo ${var}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def before():
    for path in KNOBS.values():
        if not path.exists():
            pytest.skip(f"{path} is missing on this kernel")
    values = {k: read(k) for k in KNOBS}
    assert login_shell("OMP_NUM_THREADS") == "", "OMP_NUM_THREADS is already set in login shells here"
    yield values
    # Safety net: whatever the test did, the machine ends as it started.
    cli("undo")
    for knob, value in values.items():
        if read(knob) != value:
            KNOBS[knob].write_text(value)


@pytest.fixture(scope="module")
def wheelhouse() -> list[str]:
    from provisioner import bundle

    # core only: this machine's test proves the local connection and live kernel values; the
    # default stack's install is test_up's (on a lab server), whose GBDT wheels add ~150 MB here.
    path = bundle.build_wheelhouse(bundle.default_wheelhouse(), ["core"]).path
    return ["-e", f"mlstack_wheelhouse={path}", "-e", "mlstack_components=[core]"]


@pytest.fixture(scope="module")
def applied(before, wheelhouse):
    r = cli("up", "--tags", ROLES, *OPTIONS, *wheelhouse, "--json")
    assert r.returncode == ExitCode.OK, r.stdout[-4000:] + r.stderr
    return json.loads(r.stdout)["data"]


def test_live_values_follow_the_plan(applied, before):
    values = applied["plan"]["localhost"]["values"]
    assert read("swappiness") == str(values["swappiness"]) == "10"
    assert read("thp_enabled") == values["thp_enabled"] == "always"
    assert read("thp_defrag") == values["thp_defrag"]
    # The kernel may reserve fewer pages than asked when memory is fragmented; here 16 fit.
    assert read("nr_hugepages") == "16"


def test_login_shells_get_the_plans_threads(applied):
    threads = str(applied["plan"]["localhost"]["values"]["threads_per_job"])
    assert login_shell("OMP_NUM_THREADS") == threads
    assert login_shell("OPENBLAS_NUM_THREADS") == threads
    assert login_shell("OMP_NUM_THREADS", user="ml") == threads
    assert login_shell("OMP_PROC_BIND") == "", "pinning must never be exported system-wide"


def test_services_get_the_plans_threads(applied):
    """systemd is not PID 1 on this machine: check the manager drop-in services read."""
    threads = applied["plan"]["localhost"]["values"]["threads_per_job"]
    dropins = list(Path("/etc/systemd/system.conf.d").glob("*provisioner*"))
    assert dropins, "no systemd manager drop-in"
    text = "".join(p.read_text() for p in dropins)
    assert "DefaultEnvironment=" in text and f"OMP_NUM_THREADS={threads}" in text


def test_second_run_changes_nothing(applied, wheelhouse):
    r = cli("up", "--tags", ROLES, *OPTIONS, *wheelhouse, "--json", "--no-verify")
    assert r.returncode == ExitCode.OK, r.stderr
    assert json.loads(r.stdout)["data"]["hosts"]["localhost"]["changed"] == 0


def test_ml_environment_belongs_to_the_ml_user(applied):
    python = Path("/opt/mlstack/bin/python")
    assert python.exists() and Path("/opt/mlstack").owner() == "ml"
    r = subprocess.run(["su", "-", "ml", "-c", f"{python} -c 'import numpy, sklearn'"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_check_run_after_converging_reports_nothing(applied, wheelhouse):
    r = cli("up", "--tags", ROLES, *OPTIONS, *wheelhouse, "--check", "--json", "--no-verify")
    assert r.returncode == ExitCode.OK, r.stderr
    out = json.loads(r.stdout)["data"]
    assert out["hosts"]["localhost"]["changed"] == 0, [c["task"] for c in out["changes"]]


def test_undo_restores_every_value_and_is_harmless_twice(applied, before):
    r = cli("undo", "--json")
    assert r.returncode == ExitCode.OK, r.stdout[-4000:] + r.stderr
    assert {k: read(k) for k in KNOBS} == before
    assert login_shell("OMP_NUM_THREADS") == ""
    assert not list(Path("/etc/systemd/system.conf.d").glob("*provisioner*"))
    again = cli("undo", "--json")
    assert again.returncode == ExitCode.OK, again.stderr
    assert json.loads(again.stdout)["data"]["hosts"]["localhost"]["changed"] == 0
    assert {k: read(k) for k in KNOBS} == before
