"""Role serving: the preflight's refusals (run on this machine before anything changes) and the
server configuration and units the role renders from the plan's serving section."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from playbook_cases import Run, local_host, run_cases

ROOT = Path(__file__).resolve().parents[2]
PLAN = {
    "serving": {
        "workers": 2,
        "threads_per_worker": 2,
        "worker_cpus": [[0, 4], [1, 5]],
        "memory_budget_bytes": 8_000_000_000,
        "worker_memory_bytes": 4_000_000_000,
        "cache_budget_bytes": 3_400_000_000,
        "reasons": [],
    }
}


PREFLIGHT = {
    "name": "Check the input of role serving",
    "ansible.builtin.include_role": {"name": "serving", "tasks_from": "preflight"},
}


def _refusals(run: Run, host: str) -> list[tuple[str, str]]:
    out = []
    for name, result in run.failed(host):
        # A check over a list fails per item: its message is the item's.
        items = [i["msg"] for i in result.get("results", []) if i.get("failed")]
        out.append((name, items[0] if items else result["msg"]))
    return out


# One ansible-playbook run for all of them (playbook_cases): one host per case, its variables the
# case's input; the plan comes from -e for all. The last host serves nothing.
BAD_INPUT = [
    (
        {"serving_listen": "0.0.0.0"},
        "Check serving_listen (loopback unless serving_allow_nonlocal)",
        "serving_listen 0.0.0.0 is not loopback: set serving_allow_nonlocal: true",
    ),
    (
        {"serving_enabled": True, "serving_listen": "10.0.0.5"},
        "Check serving_listen (loopback unless serving_allow_nonlocal)",
        "serving_listen 10.0.0.5 is not loopback",
    ),
    (
        {"serving_enabled": True, "serving_listen": "localhost", "serving_allow_nonlocal": True},
        "Check serving_listen is an address",
        "serving_listen must be an IPv4 or IPv6 address",
    ),
    (
        {"serving_enabled": True, "serving_workers": 0},
        "Check serving_workers and serving_threads_per_worker",
        "serving_workers and serving_threads_per_worker must be 1 or more",
    ),
    (
        {"serving_enabled": True, "serving_port": 8311},
        "Check serving_port and serving_admin_port_base",
        "serving_port (8311) must be 1..65535 and outside the admin ports",
    ),
    (
        {"serving_enabled": True, "serving_worker_cpus": [[0]]},
        "Check serving_worker_cpus",
        "serving_worker_cpus must be [] (no affinity) or one non-empty list",
    ),
    (
        {"serving_enabled": True, "serving_cache_budget_bytes": 9_000_000_000},
        "Check the memory budgets",
        "serving memory: need 0 < serving_cache_budget_bytes",
    ),
    (
        {"serving_enabled": True, "serving_max_batch_bytes": 400_000_000},
        "Check a .npy batch fits beside the cache",
        "serving memory: a .npy batch takes up to twice serving_max_batch_bytes (400000000)",
    ),
    (
        {"serving_enabled": True, "serving_registry": "/etc"},
        "Check serving_registry",
        "serving_registry must be an absolute directory of its own",
    ),
    (
        {"serving_enabled": True, "serving_models": [{"name": "../x", "version": "1"}]},
        "Check serving_models",
        "serving_models: each entry needs name and version",
    ),
    (
        {"serving_model_sources": [{"name": "fraud", "version": "1", "src": "/nonexistent/fraud/1"}]},
        "Check serving_model_sources",
        "serving_model_sources: each entry needs name and version",
    ),
]
CASE_HOSTS = {f"bad{i}": local_host(extra) for i, (extra, _, _) in enumerate(BAD_INPUT)}
NOTHING_SERVED = "nothing-served"


@pytest.fixture(scope="module")
def preflight_run(tmp_path_factory):
    # Nothing to deploy: a budget that could not work on this host is no reason to refuse the run.
    hosts = {**CASE_HOSTS, NOTHING_SERVED: local_host({"serving_cache_budget_bytes": 9_000_000_000})}
    play = [{"name": "Serving", "hosts": "all", "gather_facts": False, "tasks": [PREFLIGHT]}]
    return run_cases(tmp_path_factory, "serving-preflight", play, hosts, cwd=ROOT,
                     args=["-e", json.dumps({"provisioner_plan": PLAN})])


def test_a_run_with_bad_input_fails(preflight_run):
    assert preflight_run.returncode == 2, preflight_run.tail()


@pytest.mark.parametrize(("host", "task", "says"), [(h, task, says) for h, (_, task, says) in zip(CASE_HOSTS, BAD_INPUT, strict=True)],
                         ids=list(CASE_HOSTS))
def test_bad_input_is_refused_in_one_line_naming_the_option(preflight_run, host, task, says):
    refusals = _refusals(preflight_run, host)
    assert len(refusals) == 1, refusals
    name, msg = refusals[0]
    assert name == f"serving : {task}"
    assert msg.startswith(says) and "\n" not in msg.strip(), msg


def test_a_host_that_serves_nothing_is_not_sized(preflight_run):
    stats = preflight_run.stats(NOTHING_SERVED)
    assert stats["failures"] == 0 and stats["unreachable"] == 0 and stats["ok"] > 0, preflight_run.tail()


RENDER = [
    {"name": "Render", "ansible.builtin.include_role": {"name": "serving", "tasks_from": "preflight", "public": True}},
    {"name": "Config", "ansible.builtin.debug": {"msg": "{{ _serving_config_content }}"}},
    {"name": "Server files", "ansible.builtin.debug": {"msg": "{{ _serving_server_files }}"}},
    {"name": "Jemalloc", "ansible.builtin.debug": {"msg": "{{ serving_jemalloc | bool }}"}},

    {
        "name": "Undo removes",
        "ansible.builtin.debug": {
            "msg": "{{ (_serving_files + ['/etc/passwd', _serving_lib_dir ~ '/other.py']) | select('match', _serving_undo_pattern) | list }}"
        },
    },
    {
        "name": "Drop-in",
        "ansible.builtin.debug": {
            "msg": "{{ lookup('ansible.builtin.template', '" + str(ROOT / "roles/serving/templates/slice.conf.j2") + "') }}"
        },
        "vars": {
            "_serving_index": 1,
            "_serving_cpus": "{{ serving_worker_cpus[1] if serving_worker_cpus | length > 1 else [] }}",
        },
    },
]
# Role allocator's own play after it, which does not see role serving's defaults: the units it
# keeps a jemalloc drop-in for (a unit it leaves out, it takes the drop-in away from).
ALLOCATOR_PLAY = {
    "name": "Allocator",
    "hosts": "all",
    "gather_facts": False,
    "vars": {"allocator_services": []},
    "tasks": [
        {"name": "Allocator's vars", "ansible.builtin.include_vars": {"file": str(ROOT / "roles/allocator/vars/main.yml")}},
        {"name": "Allocator's units", "ansible.builtin.debug": {"msg": "{{ _allocator_units }}"}},
    ],
}
# What each test below renders, in one ansible-playbook run: one host per input.
RENDER_INPUT: dict[str, dict[str, Any]] = {
    "from-the-plan": {"provisioner_plan": PLAN},
    "four-workers": {"provisioner_plan": PLAN, "serving_workers": 4, "serving_worker_cpus": [[0], [1], [4], [5]]},
    "one-worker": {"provisioner_plan": PLAN, "serving_workers": 1},
    "no-plan": {"serving_models": [{"name": "fraud", "version": "3"}]},
    "jemalloc-plan": {"provisioner_plan": {"serving": {**PLAN["serving"], "allocator": "jemalloc"}}},
    "jemalloc-plan-set-false": {
        "provisioner_plan": {"serving": {**PLAN["serving"], "allocator": "jemalloc"}},
        "serving_jemalloc": False,
    },
}


@pytest.fixture(scope="module")
def render_run(tmp_path_factory):
    play = [{"name": "Serving", "hosts": "all", "gather_facts": False, "tasks": RENDER}, ALLOCATOR_PLAY]
    hosts = {h: local_host({"serving_enabled": True, **extra}) for h, extra in RENDER_INPUT.items()}
    return run_cases(tmp_path_factory, "serving-render", play, hosts, cwd=ROOT)


def test_the_rendering_run_succeeds(render_run):
    assert render_run.returncode == 0, render_run.tail()


def _rendered(run: Run, host: str) -> tuple[dict, str]:
    results = dict(run.results(host))
    assert not run.failed(host), run.tail()
    return results["Config"]["msg"], results["Drop-in"]["msg"]


def test_the_config_and_each_workers_slice_come_from_the_plan(render_run):
    config, dropin = _rendered(render_run, "from-the-plan")
    assert config["workers"] == [{"index": 0, "cpus": [0, 4], "threads": 2}, {"index": 1, "cpus": [1, 5], "threads": 2}]
    assert (config["listen"], config["port"], config["admin_port_base"]) == ("127.0.0.1", 8300, 8310)
    assert config["cache_budget_bytes"] == 3_400_000_000 and config["models"] == "all"
    lines = dropin.splitlines()
    assert "CPUAffinity=1 5" in lines and "MemoryMax=4000000000" in lines
    assert ("Environment=OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 NUMEXPR_NUM_THREADS=2") in lines


def test_the_workers_get_jemalloc_where_the_plans_allocator_is_jemalloc(render_run):
    hosts = ("jemalloc-plan", "from-the-plan", "no-plan", "jemalloc-plan-set-false")
    jemalloc = {host: dict(render_run.results(host))["Jemalloc"]["msg"] for host in hosts}
    # A plan recorded by a version without the allocator, and no plan at all: glibc's malloc, as before;
    # serving_jemalloc set for the host outranks the plan.
    assert jemalloc == {"jemalloc-plan": True, "from-the-plan": False, "no-plan": False, "jemalloc-plan-set-false": False}
    # Role allocator's play keeps the drop-in exactly where serving's gives the workers jemalloc.
    units = {host: dict(render_run.results(host))["Allocator's units"]["msg"] for host in hosts}
    assert units == {host: ["provisioner-serve@.service"] if jemalloc[host] else [] for host in hosts}


def test_other_workers_than_the_plans_split_the_budget_and_drop_its_slices(render_run):
    config, _ = _rendered(render_run, "four-workers")
    assert [w["cpus"] for w in config["workers"]] == [[0], [1], [4], [5]]
    overhead = 512 * 1024**2
    assert config["cache_budget_bytes"] == 8_000_000_000 // 4 - overhead
    config, _ = _rendered(render_run, "one-worker")
    # No slices for one worker from the plan's two: no affinity, every CPU listed.
    assert len(config["workers"]) == 1 and config["workers"][0]["cpus"] == list(range(len(config["workers"][0]["cpus"])))


def test_without_a_plan_the_facts_size_it(render_run):
    config, dropin = _rendered(render_run, "no-plan")
    cores = os.cpu_count()
    assert cores is not None
    assert config["models"] == [{"name": "fraud", "version": "3"}]
    assert all(w["threads"] == 1 for w in config["workers"]) and 1 <= len(config["workers"]) <= cores
    assert "CPUAffinity" not in dropin


def test_the_server_is_installed_and_removed_with_every_part(render_run):
    # The server imports its parts from its own directory: install copies each of them beside it,
    # undo removes each (and nothing else of that directory); the status script is run by itself.
    results = dict(render_run.results("from-the-plan"))
    files = results["Server files"]["msg"]
    here = sorted(p.name for p in (ROOT / "roles/serving/files").glob("provisioner_serve*.py"))
    assert sorted(Path(f).name for f in files) == [n for n in here if n != "provisioner_serve_status.py"]
    assert {str(Path(f).parent) for f in files} == {"/usr/local/lib/provisioner/serving"}
    removed = results["Undo removes"]["msg"]
    assert set(files) <= set(removed) and "/etc/passwd" not in removed
    assert "/usr/local/lib/provisioner/serving/other.py" not in removed
