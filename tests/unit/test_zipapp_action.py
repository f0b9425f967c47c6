"""The action plugin provisioner_zipapp, run by ansible-playbook from the checkout: the smoke test's
archive and role shared's drift check come out as the package builds them, the same bytes on every
run, never changed, also in check mode; bad options fail with one line naming them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml
from playbook_cases import BINDIR, ROOT, local_env

from provisioner import zipapp
from provisioner.smoke import zipapp as smoke_zipapp

STATUS = ROOT / "roles" / "shared" / "files" / "provisioner_status"


def run_play(tmp_path: Path, tasks: list[dict], check: bool = False) -> list[dict]:
    """Each task's result on localhost, in order."""
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    argv = [str(BINDIR / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(book)] + (["--check"] if check else [])
    env = local_env(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, check=False,
                       input="", timeout=300)
    plays = json.loads(r.stdout)["plays"]
    return [t["hosts"]["localhost"] for t in plays[0]["tasks"]]


def test_both_archives_built_as_the_package_builds_them_and_never_changed(tmp_path):
    tasks: list[dict] = [
        {"provisioner_zipapp": {"smoke": True}},
        {"provisioner_zipapp": {"src": str(STATUS)}},
        {"provisioner_zipapp": {"src": str(STATUS)}},
    ]
    smoke, status, again = run_play(tmp_path, tasks)
    assert not any(r.get("changed") or r.get("failed") for r in (smoke, status, again)), (smoke, status)
    # Ansible removes its local temporary directory after the run: the archives are known by their sha256.
    assert smoke["sha256"] == hashlib.sha256(smoke_zipapp.archive()).hexdigest()
    data = zipapp.archive(zipapp.package_entries(STATUS))
    assert status["sha256"] == again["sha256"] == hashlib.sha256(data).hexdigest()
    assert Path(status["path"]).name == f"provisioner_status-{status['sha256'][:12]}.pyz"
    # The drift check runs from its archive under the standard library alone.
    pyz = zipapp.write(data, tmp_path, "provisioner_status-")
    r = subprocess.run([sys.executable, "-I", str(pyz), "--expected-dir", str(tmp_path / "none"), "--json"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2 and json.loads(r.stdout)["error"].startswith("never provisioned"), r
    with zipfile.ZipFile(pyz) as zf:
        assert "provisioner_status/__main__.py" in zf.namelist() and "__main__.py" in zf.namelist()
    checked = run_play(tmp_path, tasks[:2], check=True)
    assert [r["sha256"] for r in checked] == [smoke["sha256"], status["sha256"]]


def test_bad_options_fail_naming_them(tmp_path):
    tasks: list[dict] = [
        {"provisioner_zipapp": {}, "ignore_errors": True},
        {"provisioner_zipapp": {"src": str(STATUS), "smoke": True}, "ignore_errors": True},
        {"provisioner_zipapp": {"src": str(tmp_path)}, "ignore_errors": True},
        {"provisioner_zipapp": {"source": "x"}, "ignore_errors": True},
    ]
    none, both, not_a_package, unknown = run_play(tmp_path, tasks)
    assert none["msg"] == both["msg"] == "provisioner_zipapp takes one of src (a package directory) and smoke: true"
    assert not_a_package["msg"] == (
        f"provisioner_zipapp: {tmp_path}: not a package with a __main__.py: src must be a package directory with a __main__.py"
    )
    assert unknown["msg"] == "provisioner_zipapp takes src or smoke, not: source"
    assert all(r["failed"] for r in (none, both, not_a_package, unknown))
