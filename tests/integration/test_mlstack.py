"""The mlstack role's refusals on a real lab server, with tiny locks and wheelhouses (a few wheels,
so each run takes seconds): a wheel missing from the wheelhouse, a wrong pin, and a lock that
lacks a dependency all fail naming the package.  Also `build_wheelhouse` for real: a cached
build downloads nothing, an unknown version on the index is named.

Then the environment's generations, with the core stack from a wheelhouse that also holds a
second threadpoolctl: a lock change builds a new generation beside the live one, proves it and
switches while a job of the ML user that started before keeps its own; a generation the doctor
fails and a lock with a wheel missing never go live; `provisioner rollback` returns, and refuses a
generation the host lacks; undo removes every generation."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from cli_run import cli_json, ssh
from playbook_run import run_playbook

from provisioner import bundle, lab
from provisioner.errors import BadInput

pytestmark = pytest.mark.lab

SERVER = "pv-mlstack"

PLAYBOOK = [
    {
        "name": "The mlstack role alone",
        "hosts": "all",
        "gather_facts": True,
        "gather_subset": ["min"],
        "pre_tasks": [
            {
                "name": "Refresh the package lists (the common role does this in site.yml)",
                "ansible.builtin.apt": {"update_cache": True},
                "when": "prepare | default(false) | bool",
            },
            {
                "name": "Create the ML user (the common role does this in site.yml)",
                "ansible.builtin.user": {"name": "ml", "password": "!"},
                "when": "prepare | default(false) | bool",
            },
        ],
        "roles": [{"role": "mlstack"}],
    }
]


def tiny_lock(path: Path, pins: list[str]) -> Path:
    path.write_text(
        yaml.safe_dump({"schema": 1, "python_version": "3.11", "glibc": "2.28", "arch": "x86_64", "components": {"core": pins}})
    )
    return path


@pytest.fixture(scope="module")
def server(lab_requirements):
    try:
        yield lab.up(SERVER)
    finally:
        lab.down(SERVER)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """A small wheelhouse built for real: threadpoolctl, joblib, scikit-learn at the lock's versions."""
    real = bundle.load_lock()
    pins = [str(p) for p in bundle.select_pins(real, ["core"]) if p.name in ("threadpoolctl", "joblib", "scikit-learn")]
    d = tmp_path_factory.mktemp("mlstack")
    lock = tiny_lock(d / "three.lock", pins)
    result = bundle.build_wheelhouse(d / "wheels", ["core"], lock_path=lock)
    assert result.downloaded == 3 and len(result.files) == 3
    again = bundle.build_wheelhouse(d / "wheels", ["core"], lock_path=lock)
    assert again.downloaded == 0 and again.reused == 3, "a second build must reuse the wheelhouse"
    return d / "wheels"


def pin(name: str) -> str:
    return next(str(p) for p in bundle.select_pins(bundle.load_lock(), ["core"]) if p.name == name)


def run_role(server: lab.LabServer, tmp_path: Path, **variables) -> subprocess.CompletedProcess:
    return run_playbook(server, tmp_path, PLAYBOOK, **variables)


def failure(r: subprocess.CompletedProcess) -> str:
    """The run's failure messages on one line (Ansible wraps long lines)."""
    assert r.returncode != 0, f"the role should have failed:\n{r.stdout[-3000:]}"
    return re.sub(r"\s+", " ", r.stdout + r.stderr)


def test_missing_wheel_is_named(server, wheels, tmp_path):
    partial = tmp_path / "partial"
    partial.mkdir()
    for f in wheels.glob("*.whl"):
        if not f.name.startswith("joblib-"):
            (partial / f.name).symlink_to(f)
    lock = tiny_lock(tmp_path / "mlstack.lock", [pin("threadpoolctl"), pin("joblib")])
    r = run_role(server, tmp_path, mlstack_components=["core"], mlstack_lock_file=str(lock), mlstack_wheelhouse=str(partial))
    text = failure(r)
    assert f"{pin('joblib')}: no wheel in {partial}" in text, text[-2000:]


def test_wrong_pin_is_named(server, wheels, tmp_path):
    lock = tiny_lock(tmp_path / "mlstack.lock", ["threadpoolctl==3.0.99", pin("joblib")])
    r = run_role(server, tmp_path, mlstack_components=["core"], mlstack_lock_file=str(lock), mlstack_wheelhouse=str(wheels))
    text = failure(r)
    version = pin("threadpoolctl").split("==")[1]
    assert f"threadpoolctl==3.0.99: no wheel in {wheels} (it has threadpoolctl {version})" in text, text[-2000:]


def test_unknown_component_is_refused(server, wheels, tmp_path):
    r = run_role(server, tmp_path, mlstack_components=["core", "gpu"], mlstack_wheelhouse=str(wheels))
    assert "unknown component gpu" in failure(r)


def test_dependency_missing_from_the_lock_is_named_by_pip(server, wheels, tmp_path):
    """The wheelhouse matches the lock, but the lock lacks scikit-learn's dependencies: pip on the
    target fails (no index to fall back on) and the role names what it could not find."""
    lock = tiny_lock(tmp_path / "mlstack.lock", [pin("scikit-learn")])
    r = run_role(
        server, tmp_path, prepare=True, mlstack_components=["core"], mlstack_lock_file=str(lock), mlstack_wheelhouse=str(wheels)
    )
    text = failure(r)
    assert re.search(r"mlstack: pip could not install .* no wheel for (numpy|scipy|joblib|threadpoolctl)\S* among", text), text[
        -3000:
    ]


def test_unknown_version_on_the_index_is_named(tmp_path):
    lock = tiny_lock(tmp_path / "mlstack.lock", ["threadpoolctl==0.0.99"])
    with pytest.raises(BadInput, match=r"pip found no wheel for threadpoolctl==0\.0\.99"):
        bundle.build_wheelhouse(tmp_path / "wheels", ["core"], lock_path=lock)


# ---------------------------------------------------------------- generations

NEW_THREADPOOLCTL = "threadpoolctl==3.7.0"
JOB = """import os, time
while not os.path.exists("/tmp/gen-go"):
    time.sleep(0.05)
import threadpoolctl
print(threadpoolctl.__version__, threadpoolctl.__file__)
"""


def sh(server: lab.LabServer, command: str) -> str:
    r = ssh(server, command)
    assert r.returncode == 0, f"{command}: {r.stderr}"
    return r.stdout.strip()


def recap_changed(r: subprocess.CompletedProcess) -> int:
    return sum(int(n) for n in re.findall(r"changed=(\d+)", r.stdout))


@pytest.fixture(scope="module")
def generations(server, tmp_path_factory):
    """The runs, in order, and what each left: the first generation, a re-run, a lock change
    (threadpoolctl 3.8.0 -> 3.7.0) under a waiting job of the ML user, a lock whose doctor fails
    (polars left out: it no longer imports), a lock with a wheel missing, then rollback."""
    d = tmp_path_factory.mktemp("generations")
    core = [str(p) for p in bundle.select_pins(bundle.load_lock(), ["core"])]
    old = pin("threadpoolctl")
    house = d / "both"
    house.mkdir()
    extra = bundle.build_wheelhouse(d / "extra", ["core"], lock_path=tiny_lock(d / "tpc.lock", [NEW_THREADPOOLCTL])).path
    for wheel in [*bundle.build_wheelhouse(bundle.default_wheelhouse(), ["core"]).path.glob("*.whl"), *extra.glob("*.whl")]:
        if not (house / wheel.name).exists():
            (house / wheel.name).symlink_to(wheel)
    locks = {
        "a": tiny_lock(d / "a.lock", core),
        "b": tiny_lock(d / "b.lock", [NEW_THREADPOOLCTL if p == old else p for p in core]),
        "broken": tiny_lock(d / "broken.lock", [p for p in core if not p.startswith("polars==")]),
        "missing": tiny_lock(d / "missing.lock", ["threadpoolctl==3.6.0" if p == old else p for p in core]),
    }

    def role(run: str, lock: str) -> subprocess.CompletedProcess:
        where = d / run
        where.mkdir()
        return run_role(
            server,
            where,
            prepare=True,
            mlstack_components=["core"],
            mlstack_lock_file=str(locks[lock]),
            mlstack_wheelhouse=str(house),
        )

    def live() -> str:
        return sh(server, "readlink /opt/mlstack")

    state: dict = {"first": role("first", "a")}
    assert state["first"].returncode == 0, state["first"].stdout[-5000:]
    state["live_a"] = live()
    state["again"] = role("again", "a")
    # A job of the ML user, started before the switch from a login shell; it imports after it.
    sh(
        server,
        "rm -f /tmp/gen-go /tmp/gen-job.out && cat > /tmp/gen-job.py <<'EOF'\n" + JOB + "EOF\n"
        "su - ml -c 'nohup python /tmp/gen-job.py > /tmp/gen-job.out 2>&1 &'",
    )
    state["change"] = role("change", "b")
    state["live_b"] = live()
    sh(server, "touch /tmp/gen-go")
    state["job"] = sh(server, "for i in $(seq 100); do test -s /tmp/gen-job.out && break; sleep 0.1; done; cat /tmp/gen-job.out")
    state["fresh"] = sh(server, "su - ml -c 'python -c \"import threadpoolctl; print(threadpoolctl.__version__)\"'")
    state["inodes"] = sh(
        server,
        " ".join(f"stat -c %i {g}/lib/python3.11/site-packages/numpy/__init__.py;" for g in (state["live_a"], state["live_b"])),
    )
    state["broken"] = role("broken", "broken")
    state["live_after_broken"] = live()
    state["missing"] = role("missing", "missing")
    state["live_after_missing"] = live()
    state["store_after_failures"] = sorted(sh(server, "ls /opt/mlstack-envs").split())
    state["rollback"] = cli_json("rollback", "-i", str(server.inventory))
    state["live_after_rollback"] = live()
    state["rollback_unknown"] = cli_json("rollback", "-i", str(server.inventory), "--to", "0123456789ab")
    state["live_after_unknown"] = live()
    state["rollback_bad"] = cli_json("rollback", "-i", str(server.inventory), "--to", "../a")
    return state


def test_a_first_generation_goes_live_and_a_rerun_changes_nothing(generations):
    assert generations["first"].returncode == 0, generations["first"].stdout[-3000:]
    assert re.fullmatch(r"/opt/mlstack-envs/[0-9a-f]{12}", generations["live_a"])
    assert generations["again"].returncode == 0 and recap_changed(generations["again"]) == 0, generations["again"].stdout[-3000:]


def test_a_lock_change_builds_a_new_generation_and_a_running_job_keeps_its_own(generations):
    g = generations
    assert g["change"].returncode == 0, g["change"].stdout[-3000:]
    assert g["live_b"] != g["live_a"]
    # The job that started before the switch imported after it, from the generation it started in.
    assert g["job"] == f"3.8.0 {g['live_a']}/lib/python3.11/site-packages/threadpoolctl.py", g["job"]
    assert g["fresh"] == "3.7.0"
    # The new generation is a copy of the old one: what did not change is shared, not installed again.
    first, second = g["inodes"].split()
    assert first == second


def test_a_generation_the_doctor_fails_or_pip_cannot_build_never_goes_live(generations):
    g = generations
    text = failure(g["broken"])
    assert "failed the doctor and did not go live" in text and "polars" in text, text[-3000:]
    assert g["live_after_broken"] == g["live_b"]
    text = failure(g["missing"])
    assert "threadpoolctl==3.6.0: no wheel in" in text, text[-3000:]
    assert g["live_after_missing"] == g["live_b"]
    # Neither left a directory behind: the two generations and their history.
    assert g["store_after_failures"] == sorted([g["live_a"].rsplit("/", 1)[1], g["live_b"].rsplit("/", 1)[1], "generations.json"])


def test_rollback_returns_to_the_previous_generation_and_refuses_one_the_host_lacks(generations):
    g = generations
    rc, data = g["rollback"]
    assert rc == 0, data
    assert g["live_after_rollback"] == g["live_a"]
    rc, data = g["rollback_unknown"]
    assert rc != 0 and g["live_after_unknown"] == g["live_a"]
    assert "has no generation 0123456789ab" in json.dumps(data), data
    rc, data = g["rollback_bad"]
    assert rc == 2, data


def test_undo_removes_the_environment_and_every_generation(generations, server, tmp_path):
    undo = [
        {
            "name": "Undo mlstack",
            "hosts": "all",
            "gather_facts": False,
            "tasks": [{"ansible.builtin.include_role": {"name": "mlstack", "tasks_from": "undo"}}],
        }
    ]
    r = run_playbook(server, tmp_path, undo)
    assert r.returncode == 0, r.stdout[-3000:]
    assert sh(server, "ls -d /opt/mlstack /opt/mlstack-envs 2>/dev/null; true") == ""
