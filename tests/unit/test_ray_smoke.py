"""provisioner smoke --cluster: the judgement of the distributed trials (every trial ran, on every
node, with the threads its reservation gives), and the cluster run being opt-in in the script."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import smoke_script

from provisioner import smoke

ROOT = Path(__file__).resolve().parents[2]


def raw_cluster() -> dict:
    run = {
        "trials": 12,
        "trials_expected": 12,
        "seconds": 30.0,
        "trials_per_min": 24.0,
        "threads_seen": [1],
        "per_node": {"ray-h": 4, "ray-w1": 4, "ray-w2": 4},
        "errors": [],
    }
    head = {**run, "seconds": 36.0, "trials_per_min": 20.0, "per_node": {"ray-h": 12}}
    return {
        "library": "sklearn",
        "ray": "2.60.0",
        "optuna": "5.0.0",
        "trial_cpus": 1,
        "members": ["ray-h", "ray-w1", "ray-w2"],
        "trials": 12,
        "rows": 100_000,
        "trees": 40,
        "sampler": "enqueued",
        "runs": {"cluster": run, "head": head},
        "nodes": [{"name": n, "cpus": 2.0} for n in ("ray-h", "ray-w1", "ray-w2")],
    }


def test_a_complete_run_passes_with_the_ratio_to_the_head_alone():
    (check,) = smoke.cluster_checks(raw_cluster())
    assert check.status == smoke.PASS, check.reason
    assert check.figure == 24.0 and check.limit == 20.0 and check.ratio == pytest.approx(1.2)
    assert "ray-h 4, ray-w1 4, ray-w2 4" in check.reason and "1 thread(s) each" in check.reason


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda r: r["runs"]["cluster"].update(trials=11), "cluster: 11 of 12 trials completed"),
        (lambda r: r["runs"]["cluster"]["per_node"].pop("ray-w2"), "ray-w2 ran no trial"),
        (lambda r: r["runs"]["head"].update(threads_seen=[1, 2]), "trials ran [2] OpenMP threads"),
        (lambda r: r["nodes"].pop(), "member(s) ray-w2 not in the cluster"),
    ],
)
def test_lost_work_fails_naming_it(change, named):
    raw = copy.deepcopy(raw_cluster())
    change(raw)
    (check,) = smoke.cluster_checks(raw)
    assert check.status == smoke.FAIL and named in check.reason, check.reason


def test_a_missing_component_is_a_skip_and_the_judgement_runs_through_evaluate():
    (check,) = smoke.cluster_checks({"skipped": "ray is not installed (component distributed)"})
    assert check.status == smoke.SKIP
    report = smoke.evaluate({"mode": "baseline", "results": {"cluster": raw_cluster()}})
    assert [c.id for c in report.checks] == ["cluster.trials"]


def test_the_cluster_run_is_only_run_when_named():
    module = smoke_script.load()
    # CLUSTER_TASKS: the workloads run only when named (the cluster's and the opt-in ones).
    assert "cluster" not in module.TASKS and "cluster" in module.CLUSTER_TASKS
    from provisioner.smoke.workloads import cluster, hpo

    assert module.WORKERS["cluster"] is cluster.w_cluster
    assert hpo._hpo_queue(4) == hpo._hpo_queue(4)[:4] and len(hpo._hpo_queue(6)) == 6


def _inventory(tmp_path: Path, groups: dict) -> Path:
    import yaml

    path = tmp_path / "hosts.yml"
    children = {g: {"hosts": {h: {"ansible_host": "10.0.0.1"} for h in hosts}} for g, hosts in groups.items()}
    path.write_text(yaml.safe_dump({"all": {"children": children}}))
    return path


def test_smoke_cluster_runs_on_the_members_and_names_the_hosts_it_leaves_out(tmp_path):
    from provisioner.commands import cluster_members

    inv = _inventory(tmp_path, {"ray_head": ["box1"], "ray_workers": ["box2", "box3"], "lab": ["r44"]})
    assert cluster_members(inv, None, {}) == (["box1", "box2", "box3"], ["r44"])
    assert cluster_members(inv, "box1,r44", {}) == (["box1"], ["r44"])
    # The groups as -e names them (role ray's ray_head_group and ray_worker_group).
    inv = _inventory(tmp_path, {"heads": ["box1"], "ray_workers": ["box2"], "nodes": ["box3"]})
    assert cluster_members(inv, None, {"ray_head_group": "heads", "ray_worker_group": "nodes"}) == (["box1", "box3"], ["box2"])


@pytest.mark.parametrize(("limit", "named"), [(None, "no host of group ray_head is in the run;"), ("box2", "(--limit box2)")])
def test_smoke_cluster_without_the_head_is_refused_naming_the_group(tmp_path, limit, named):
    from provisioner.commands import cluster_members
    from provisioner.errors import BadInput

    groups = {"ray_workers": ["box2"], "lab": ["r44"]} if limit is None else {"ray_head": ["box1"], "ray_workers": ["box2"]}
    with pytest.raises(BadInput, match=re.escape(named)):
        cluster_members(_inventory(tmp_path, groups), limit, {})
