"""The installable forms: a wheel that works outside the source tree, and an Ansible collection.

Both are built from this checkout and used for real: the wheel's `provisioner` derives the
plan of this machine with the content it carries; the collection's roles and plugins run in
a plain ansible-playbook run that knows nothing of the checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _env(tmp: Path) -> dict[str, str]:
    """An environment with no trace of the checkout: no ANSIBLE_* settings, state kept in tmp."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PROVISIONER_"))}
    env["PROVISIONER_STATE_DIR"] = str(tmp / "state")
    env["HOME"] = str(tmp / "home")
    return env


def _run(cmd: list[str], tmp: Path, **kwargs) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("env", _env(tmp))
    proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, **kwargs)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)], out)
    (built,) = out.glob("provisioner-*.whl")
    return built


def test_the_wheel_carries_the_ansible_content_and_nothing_of_the_tests(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    content = "provisioner/_content/"
    for needed in (
        "roles/common/tasks/main.yml",
        "roles/storage/meta/argument_specs.yml",
        "playbooks/site.yml",
        "inventories/local/hosts.yml",
        "plugins/modules/provisioner_facts.py",
        "plugins/action/provisioner_plan.py",
        "requirements/mlstack.lock",
        "ansible.cfg",
    ):
        assert content + needed in names, f"{needed} is missing from the wheel"
    assert "provisioner/templates/report.html.j2" in names
    assert not [n for n in names if "__pycache__" in n or n.startswith(("tests/", "molecule/"))]


def test_an_installed_wheel_plans_this_machine_from_its_own_content(wheel: Path, tmp_path: Path) -> None:
    # A fresh venv with the wheel installed; its dependencies come from the test venv's
    # site-packages through a .pth file (no download), not the checkout.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    _run([str(BIN / "pip"), "--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index", str(wheel)], tmp_path)
    # ansible-runner starts ansible-playbook and ansible-inventory from the interpreter's bin
    # directory: the dependencies' scripts, pointed at the new venv's interpreter.
    for tool in BIN.glob("ansible*"):
        script = tool.read_text().splitlines()
        (venv / "bin" / tool.name).write_text("\n".join([f"#!{venv / 'bin' / 'python'}", *script[1:]]) + "\n")
        (venv / "bin" / tool.name).chmod(0o755)

    where = _run([str(venv / "bin" / "python"), "-c", "import provisioner.paths as p; print(p.HOME)"], tmp_path)
    assert Path(where.stdout.strip()) == site / "provisioner" / "_content"

    plan = _run([str(venv / "bin" / "provisioner"), "plan", "--json"], tmp_path)
    out = json.loads(plan.stdout)
    data = out.get("data", out)
    (host_plan,) = data.values()
    assert host_plan["values"]["threads_per_job"] >= 1


def test_the_collection_builds_and_its_roles_run_in_a_plain_playbook(tmp_path: Path) -> None:
    _run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path), str(ROOT)], tmp_path)
    (tarball,) = tmp_path.glob("provisioner-ml-*.tar.gz")
    with tarfile.open(tarball) as built:
        members = built.getnames()
    assert "roles/thread_env/tasks/main.yml" in members and "plugins/modules/provisioner_storage.py" in members
    assert not [m for m in members if m.startswith(("tests/", "molecule/", "provisioner/", ".venv"))]

    collections = tmp_path / "collections"
    _run([str(BIN / "ansible-galaxy"), "collection", "install", "-p", str(collections), str(tarball)], tmp_path)
    (tmp_path / "play.yml").write_text(
        "- hosts: localhost\n"
        "  connection: local\n"
        "  gather_facts: true\n"
        "  gather_subset: [min]\n"
        "  roles:\n"
        "    - role: provisioner.ml.plan\n"
        "  tasks:\n"
        "    - name: Show the plan's threads\n"
        "      ansible.builtin.debug:\n"
        "        msg: \"threads={{ provisioner_plan['values']['threads_per_job'] }}\"\n"
    )
    env = _env(tmp_path) | {"ANSIBLE_COLLECTIONS_PATH": str(collections), "ANSIBLE_NOCOLOR": "1"}
    # The facts module needs psutil and py-cpuinfo: this interpreter has them.
    inventory = ["-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}"]
    play = _run([str(BIN / "ansible-playbook"), *inventory, "play.yml"], tmp_path, env=env)
    assert "threads=" in play.stdout
    assert "failed=0" in play.stdout
