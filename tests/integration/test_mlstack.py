"""The mlstack role's refusals on a real lab server, with tiny locks and wheelhouses (a few wheels,
so each run takes seconds): a wheel missing from the wheelhouse, a wrong pin, and a lock that
lacks a dependency all fail naming the package.  Also `build_wheelhouse` for real: a cached
build downloads nothing, an unknown version on the index is named."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
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
        yaml.safe_dump(
            {"schema": 1, "python_version": "3.11", "glibc": "2.28", "arch": "x86_64", "components": {"core": pins}}
        )
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
    r = run_role(server, tmp_path, mlstack_components=["core"], mlstack_lock_file=str(lock),
                 mlstack_wheelhouse=str(partial))
    text = failure(r)
    assert f"{pin('joblib')}: no wheel in {partial}" in text, text[-2000:]


def test_wrong_pin_is_named(server, wheels, tmp_path):
    lock = tiny_lock(tmp_path / "mlstack.lock", ["threadpoolctl==3.0.99", pin("joblib")])
    r = run_role(server, tmp_path, mlstack_components=["core"], mlstack_lock_file=str(lock),
                 mlstack_wheelhouse=str(wheels))
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
    r = run_role(server, tmp_path, prepare=True, mlstack_components=["core"], mlstack_lock_file=str(lock),
                 mlstack_wheelhouse=str(wheels))
    text = failure(r)
    assert re.search(r"mlstack: pip could not install .* no wheel for (numpy|scipy|joblib|threadpoolctl)\S* among", text), \
        text[-3000:]


def test_unknown_version_on_the_index_is_named(tmp_path):
    lock = tiny_lock(tmp_path / "mlstack.lock", ["threadpoolctl==0.0.99"])
    with pytest.raises(BadInput, match=r"pip found no wheel for threadpoolctl==0\.0\.99"):
        bundle.build_wheelhouse(tmp_path / "wheels", ["core"], lock_path=lock)
