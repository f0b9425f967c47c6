"""What the mlstack role promises, checked on the target: the environment exists and belongs to
the ML user, the system Python got no packages, the pins are installed, and the doctor passes
(BLAS kernel for the CPU, one OpenMP runtime with every component's libraries imported together,
the plan's threads, the thread variables of the login shell, torch with MKL and oneDNN, Optuna,
TensorFlow and Ray importing where their component is installed)."""

from __future__ import annotations

import json
import shlex

import pytest

from provisioner.checks import as_root, role_vars

MANIFEST = "mlstack.json"
DOCTOR = "bin/mlstack-doctor"


@pytest.fixture()
def ms(host):
    return role_vars(host, "mlstack")


@pytest.fixture()
def venv(ms) -> str:
    return ms["mlstack_venv"]


@pytest.fixture()
def owner(host, ms) -> str:
    return ms["mlstack_owner"] or role_vars(host, "common")["common_ml_user"]


@pytest.fixture()
def manifest(host, venv) -> dict:
    f = host.file(f"{venv}/{MANIFEST}")
    assert f.exists, f"no {venv}/{MANIFEST}: the mlstack role has not run on this host"
    return json.loads(f.content_string)


def as_user(owner: str, command: str) -> str:
    """COMMAND in a login shell of OWNER: the environment a user who logs in gets."""
    return f"runuser -l {shlex.quote(owner)} -c {shlex.quote(command)}"


def test_environment_belongs_to_the_ml_user(host, venv, owner):
    d = host.file(venv)
    assert d.is_directory, f"{venv} does not exist"
    # A symlink to the live generation (mlstack_venv-envs/HASH), or the user's own directory used in place.
    if d.is_symlink:
        d = host.file(d.linked_to)
        parent = d.path.rstrip("/").rsplit("/", 2)[-2]
        assert d.is_directory and parent.endswith("-envs"), f"{venv} points at {d.path}, not a generation"
    assert d.user == owner, f"{d.path} belongs to {d.user}, not {owner}"
    python = host.file(f"{venv}/bin/python")
    assert python.exists
    site = host.check_output(f"find {shlex.quote(venv)}/lib -maxdepth 2 -name site-packages")
    assert site and host.file(site.splitlines()[0]).user == owner


def test_environment_is_made_with_the_system_python(host, venv):
    cfg = dict(
        (k.strip(), v.strip())
        for k, _, v in (ln.partition("=") for ln in host.file(f"{venv}/pyvenv.cfg").content_string.splitlines())
        if k.strip()
    )
    assert cfg.get("home") in ("/usr/bin", "/bin"), f"pyvenv.cfg home is {cfg.get('home')}, not the system Python"
    assert cfg.get("include-system-site-packages") == "false"


def test_system_python_untouched(host, owner):
    """pip never installed into the system Python: no dist-info in its site directories."""
    with as_root(host):
        out = host.check_output(
            f"for d in /usr/local/lib/python3*/dist-packages ~{shlex.quote(owner)}/.local/lib/python3*/site-packages; do "
            '[ -d "$d" ] && find "$d" -maxdepth 1 -name \'*.dist-info\'; done; true'
        )
    assert out.strip() == "", f"packages pip-installed outside the environment: {out.strip()}"
    assert host.run("/usr/bin/python3 -c 'import numpy'").rc != 0, "numpy imports in the system Python"


def test_pins_are_installed(host, venv, owner, manifest):
    with as_root(host):
        freeze = host.check_output(as_user(owner, f"{venv}/bin/python -m pip freeze --all --disable-pip-version-check"))
    installed = {}
    for line in freeze.splitlines():
        name, sep, version = line.partition("==")
        if sep:
            installed[name.strip().lower().replace("_", "-").replace(".", "-")] = version.strip()
    wrong = []
    for pin in manifest["pins"]:
        name, _, version = pin.partition("==")
        if installed.get(name) != version:
            wrong.append(f"{pin} (installed: {installed.get(name, 'none')})")
    assert not wrong, f"not installed as pinned: {', '.join(wrong)}"


def test_doctor_passes(host, venv, owner):
    with as_root(host):
        r = host.run(as_user(owner, f"{venv}/{DOCTOR} --json"))
    assert r.stdout.strip(), f"the doctor printed nothing (rc {r.rc}): {r.stderr.strip()[-500:]}"
    result = json.loads(r.stdout)
    failed = [f"{c['name']}: {c['detail']}" for c in result["checks"] if c["status"] == "fail"]
    assert r.rc == 0 and result["ok"], f"mlstack-doctor failed: {'; '.join(failed)}"
    names = {c["name"] for c in result["checks"] if c["status"] == "pass"}
    assert {"imports", "blas-kernel", "openmp", "threads"} <= names
    if host.file("/etc/provisioner/threads.conf").exists:  # thread_env ran: its variables reach the login shell
        assert "thread-env" in names, next(c["detail"] for c in result["checks"] if c["name"] == "thread-env")
    if "torch" in result["components"]:
        assert {"torch-mkl", "torch-mkldnn"} <= names
    libraries = {"hpo": "optuna", "tensorflow": "tensorflow", "distributed": "ray"}
    for component, check in libraries.items():
        if component in result["components"]:
            assert check in names, f"the {component} component is installed but the doctor's {check} check did not pass"
            assert result["packages"].get(check), f"no {check} version in the doctor's report"


def test_jupyter_kernel_carries_the_threads(host, venv, manifest):
    kernel = host.file(f"{venv}/share/jupyter/kernels/mlstack/kernel.json")
    if "notebook" not in manifest["components"]:
        assert not kernel.exists
        return
    spec = json.loads(kernel.content_string)
    assert spec["argv"][0] == f"{venv}/bin/python"
    threads = {k: v for k, v in spec.get("env", {}).items() if k.endswith("_THREADS")}
    assert threads and len(set(threads.values())) == 1, f"kernel env: {spec.get('env')}"
