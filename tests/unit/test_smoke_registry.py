"""The smoke workloads' registry: every module under provisioner/smoke/workloads is registered once,
named as the target names its results, with the interface the judgement calls; and the layers stay
one way (the workload modules import the base and the hardware limits, never what sits above them)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from provisioner import smoke
from provisioner.smoke.workloads import BY_NAME, WORKLOADS

PACKAGE = Path(smoke.__file__).parent
MODULES = sorted(p for p in (PACKAGE / "workloads").glob("*.py") if p.name != "__init__.py")
# What a workload module may import from this package: the layers below the registry.
BELOW = {
    "provisioner.smoke.base",
    "provisioner.smoke.hardware",
    "provisioner.smoke.target.http",
    "provisioner.smoke.target.ml",
    "provisioner.smoke.target.probe",
}


def test_every_workload_module_is_registered_once_under_its_file_name():
    assert sorted(w.NAME for w in WORKLOADS) == sorted(p.stem for p in MODULES)
    assert len(BY_NAME) == len(WORKLOADS) and all(BY_NAME[w.NAME] is w for w in WORKLOADS)
    assert all(w.__name__ == f"provisioner.smoke.workloads.{w.NAME}" for w in WORKLOADS)


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.NAME)
def test_each_workload_has_the_interface_the_judgement_calls(workload):
    assert list(inspect.signature(workload.checks).parameters) == ["raw", "result"]
    spreads = getattr(workload, "spreads", None)
    assert spreads is None or len(inspect.signature(spreads).parameters) == 1
    doc = inspect.getdoc(workload) or ""
    assert "control node" in doc and f"results.{workload.NAME}" in doc, doc


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_a_workload_imports_only_the_layers_below_the_registry(path):
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = "provisioner.smoke" if node.level == 2 else "provisioner.smoke.workloads"
            found.add(f"{base}.{node.module}" if node.module else base)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("provisioner"):
            found.add(str(node.module))
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("provisioner")}
    siblings = {f"provisioner.smoke.workloads.{p.stem}" for p in MODULES}
    assert found <= BELOW | siblings, found


def test_a_skipped_or_failed_workload_is_one_check_naming_why():
    raw = {"mode": "tuned", "results": {}}
    for workload in WORKLOADS:
        skipped = workload.checks(raw, {"skipped": "not installed"})
        failed = workload.checks(raw, {"error": "boom"})
        assert [c.status for c in skipped] == [smoke.SKIP] and skipped[0].reason == "not installed", workload.NAME
        assert [c.status for c in failed] == [smoke.FAIL] and "boom" in failed[0].reason, workload.NAME


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.NAME)
def test_each_workload_has_the_interface_the_target_calls(workload):
    """SIZES for both profiles with the same keys; WORKERS: task -> measuring function; drive, where
    it has one: the root parent's step."""
    sizes = workload.SIZES
    assert list(sizes) == ["quick", "full"] and list(sizes["quick"]) == list(sizes["full"])
    assert workload.WORKERS and all(callable(f) for f in workload.WORKERS.values())
    assert callable(getattr(workload, "drive", callable))


@pytest.mark.parametrize("machine", ["vm_2vcpu", "xeon_2s"])
def test_each_workloads_knobs_are_values_of_the_plan(machine):
    """What a tuner may vary for a workload is named as the plan names it, on any machine."""
    from facts_fixtures import load

    from provisioner.plan import PlanOptions, derive_plan

    values = derive_plan(load(machine), PlanOptions()).to_dict()["values"]
    for workload in WORKLOADS:
        knobs = workload.KNOBS
        assert knobs and len(set(knobs)) == len(knobs), workload.NAME
        assert set(knobs) <= set(values), (workload.NAME, sorted(set(knobs) - set(values)))


def test_the_target_runs_every_workload_once_and_each_task_has_one_owner():
    from provisioner.smoke.workloads import CLUSTER_TASKS, PROFILES, TASKS, WORKERS

    assert sorted(TASKS + CLUSTER_TASKS) == sorted(BY_NAME) and not set(TASKS) & set(CLUSTER_TASKS)
    owners = [task for w in WORKLOADS for task in w.WORKERS]
    assert len(owners) == len(set(owners)) == len(WORKERS)
    keys = [k for w in WORKLOADS for k in w.SIZES["quick"]]
    assert len(keys) == len(set(keys)) and list(PROFILES["quick"]) == [*keys, "timeout"]
