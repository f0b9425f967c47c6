"""The smoke test's target half as the one archive the role ships: built byte for byte the same
from the same sources, holding the target code, the workloads and the layers below them (not the
judgement), importing only the standard library at the top of every module it holds, and running
under the standard library alone."""

from __future__ import annotations

import ast
import hashlib
import subprocess
import sys
import zipfile

import pytest

from provisioner.smoke import zipapp
from provisioner.zipapp import DATE

ENTRIES = zipapp.sources()
MODULES = sorted(name for name in ENTRIES if name.startswith("provisioner/"))


def test_the_same_sources_give_the_same_bytes_named_by_their_hash(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = zipapp.build(tmp_path / "a"), zipapp.build(tmp_path / "b")
    assert first.read_bytes() == second.read_bytes() == zipapp.archive()
    assert first.name == f"provisioner_smoke-{hashlib.sha256(first.read_bytes()).hexdigest()[:12]}.pyz"
    assert oct(first.stat().st_mode & 0o777) == "0o644"
    assert zipapp.build(tmp_path / "b") == second and sorted(p.name for p in (tmp_path / "b").iterdir()) == [second.name]


def test_the_archive_holds_the_target_the_workloads_and_the_layers_below_them(tmp_path):
    with zipfile.ZipFile(zipapp.build(tmp_path)) as zf:
        infos = zf.infolist()
    names = [i.filename for i in infos]
    assert names == sorted(names) and "__main__.py" in names
    assert {"provisioner/__init__.py", "provisioner/smoke/__init__.py", "provisioner/smoke/base.py",
            "provisioner/smoke/hardware.py", "provisioner/smoke/workloads/__init__.py",
            "provisioner/smoke/target/parent.py"} <= set(names)
    assert not [n for n in names if "judgement" in n or "store" in n or "__pycache__" in n or n.endswith(".pyc")]
    assert {i.date_time for i in infos} == {DATE} and {i.compress_type for i in infos} == {zipfile.ZIP_STORED}
    assert zipfile.ZipFile(zipapp.build(tmp_path)).read("provisioner/smoke/__init__.py") == zipapp.SMOKE_STUB.encode()


@pytest.mark.parametrize("name", MODULES)
def test_every_module_in_the_archive_imports_only_the_standard_library_at_its_top(name):
    """A heavy library (numpy, torch...) is imported inside the function that measures with it: the
    root parent runs under the system Python, and the control-node code beside a workload's target
    code is imported there too."""
    found = set()
    for node in ast.parse(ENTRIES[name]).body:
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add(str(node.module).split(".")[0])
    assert found <= set(sys.stdlib_module_names) | {"provisioner"}, found - set(sys.stdlib_module_names)
    package = name.rsplit("/", 1)[0].split("/")
    for node in ast.parse(ENTRIES[name]).body:  # and what it imports of the package is in the archive
        if isinstance(node, ast.ImportFrom) and node.level:
            where = "/".join([*package[: len(package) - node.level + 1], *filter(None, (node.module or "").split("."))])
            assert f"{where}.py" in ENTRIES or f"{where}/__init__.py" in ENTRIES, (name, node.module)


def test_the_archive_runs_and_imports_all_it_holds_under_the_standard_library_alone(tmp_path):
    pyz = zipapp.build(tmp_path)
    r = subprocess.run([sys.executable, "-S", "-E", "-s", str(pyz), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "worker" in r.stdout, r.stderr
    modules = [n.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for n in MODULES]
    code = (f"import sys; sys.path.insert(0, {str(pyz)!r}); import importlib; "
            f"[importlib.import_module(m) for m in {modules!r}]; "
            f"assert all(sys.modules[m].__file__.startswith({str(pyz)!r}) for m in {modules!r})")
    r = subprocess.run([sys.executable, "-S", "-E", "-s", "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
