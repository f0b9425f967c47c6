"""The plan's serving section: workers x threads, CPU slices, the memory budget, refusals."""

from __future__ import annotations

import copy
import json

import pytest
from facts_fixtures import load

from provisioner.constants import SERVING_WORKER_OVERHEAD_BYTES
from provisioner.plan import GIB, PlanError, PlanOptions, core_cpus, derive_plan


@pytest.mark.parametrize(
    ("machine", "workers", "threads"),
    [
        ("epyc_4545p", 4, 4),  # 16 cores: 4 x 4
        ("xeon_2s", 16, 4),  # 2 x 32 cores: 16 x 4
        ("vm_2vcpu", 2, 1),  # 2 cores, no SMT: 2 x 1
        ("laptop_4c", 4, 1),  # 4 cores: 4 x 1
    ],
)
def test_workers_times_threads_is_the_physical_cores(machine, workers, threads):
    f = load(machine)
    plan = derive_plan(f)
    serving = plan.serving
    assert serving is not None
    assert (serving["workers"], serving["threads_per_worker"]) == (workers, threads)
    assert workers * threads == f["cpu"]["cores"]
    assert plan.value("serving_workers") == workers
    assert plan.value("serving_threads_per_worker") == threads
    assert plan.reason("serving_workers").startswith(f"{workers}: {workers} worker(s) x {threads} thread(s)")
    # One slice per worker, disjoint, each its cores and their SMT siblings: the whole host.
    slices = serving["worker_cpus"]
    assert len(slices) == workers
    flat = [cpu for s in slices for cpu in s]
    assert len(flat) == len(set(flat)) == f["cpu"]["threads"]
    assert all(len(s) == threads * f["cpu"]["threads_per_core"] for s in slices)


def test_slices_follow_the_sibling_lists_when_the_facts_have_them():
    f = load("laptop_4c")
    # A host whose siblings are numbered in pairs (0-1, 2-3, ...), not k and k + cores.
    f["cpu"]["core_cpus"] = [[0, 1], [2, 3], [4, 5], [6, 7]]
    serving = derive_plan(f).serving
    assert serving is not None
    assert serving["worker_cpus"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert "sysfs sibling lists" in serving["reasons"][2]


def test_without_sibling_lists_the_usual_numbering_is_assumed_and_said():
    slices, source = core_cpus(load("epyc_4545p"))
    assert slices[0] == [0, 16] and slices[15] == [15, 31]
    assert "usual numbering" in source
    # A sibling list that does not match the core count is not trusted.
    f = load("epyc_4545p")
    f["cpu"]["core_cpus"] = [[0, 16]]
    assert core_cpus(f)[0][1] == [1, 17]


def test_memory_budget_is_the_share_of_ram_after_hugepages_split_over_workers():
    f = load("epyc_4545p")
    total = f["memory"]["total_bytes"]
    plan = derive_plan(f, PlanOptions(hugepages_size="1G", hugepages_count=64))
    serving = plan.serving
    assert serving is not None
    expected = int((total - 64 * GIB) * 0.5)
    assert serving["memory_budget_bytes"] == expected == plan.value("serving_memory_budget_bytes")
    assert serving["worker_memory_bytes"] == expected // 4
    assert serving["cache_budget_bytes"] == expected // 4 - SERVING_WORKER_OVERHEAD_BYTES
    assert "64.0 GiB hugepages" in plan.reason("serving_memory_budget_bytes")

    bigger = derive_plan(f, PlanOptions(serving_memory_share=0.8)).serving
    assert bigger is not None
    assert bigger["memory_budget_bytes"] == int(total * 0.8)


def test_overrides_are_taken_and_the_rest_follows():
    f = load("epyc_4545p")
    serving = derive_plan(f, PlanOptions(serving_threads_per_worker=8)).serving
    assert serving is not None
    assert (serving["workers"], serving["threads_per_worker"]) == (2, 8)
    serving = derive_plan(f, PlanOptions(serving_workers=2)).serving
    assert serving is not None
    assert (serving["workers"], serving["threads_per_worker"]) == (2, 4)
    assert "8 core(s) left" in serving["reasons"][2]


def test_the_allocator_is_glibc_unless_the_option_says_jemalloc_and_a_tuned_one_says_why():
    f = load("epyc_4545p")
    plan = derive_plan(f)
    assert plan.serving is not None and plan.serving["allocator"] == plan.value("serving_allocator") == "glibc"
    assert plan.reason("serving_allocator").startswith("glibc: the system malloc; jemalloc (plan_serving_allocator)")
    evidence = "1.08x over the rule (11 pairs, spread 2%, 2026-12-06)"
    tuned = derive_plan(
        f, PlanOptions.from_vars({"plan_serving_allocator": "JEMALLOC", "plan_tuned": {"serving_allocator": evidence}})
    )
    assert tuned.serving is not None and tuned.serving["allocator"] == "jemalloc"
    assert tuned.reason("serving_allocator") == f"tuned: {evidence}; jemalloc: plan_serving_allocator " + (
        "(preloaded into each worker through role allocator's drop-in)"
    )
    # Nothing else of the server moves with it.
    assert {k: v for k, v in tuned.serving.items() if k not in ("allocator", "reasons")} == {
        k: v for k, v in plan.serving.items() if k not in ("allocator", "reasons")
    }


def test_oversubscription_is_refused_naming_the_numbers_and_the_fix():
    with pytest.raises(
        PlanError, match=r"8 workers x 4 threads = 32 is more than the 16 physical cores.*plan_allow_oversubscription"
    ):
        derive_plan(load("epyc_4545p"), PlanOptions(serving_workers=8))
    plan = derive_plan(load("epyc_4545p"), PlanOptions(serving_workers=8, allow_oversubscription=True))
    assert any("oversubscribed by choice" in w for w in plan.warnings)
    # Overlapping slices would be a lie: every worker gets the whole host instead.
    assert plan.serving is not None
    assert all(len(s) == 32 for s in plan.serving["worker_cpus"])


def test_too_little_memory_per_worker_is_refused():
    f = copy.deepcopy(load("laptop_4c"))
    f["memory"]["total_bytes"] = 4 * GIB
    with pytest.raises(PlanError, match=r"per worker leaves .* for models .*plan_serving_workers"):
        derive_plan(f)
    # One worker with the whole share fits.
    serving = derive_plan(f, PlanOptions(serving_workers=1, serving_threads_per_worker=4)).serving
    assert serving is not None
    assert serving["workers"] == 1


def test_the_section_travels_as_json():
    plan = derive_plan(load("xeon_2s"))
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["serving"]["workers"] == 16
    assert set(data["serving"]) == {
        "workers",
        "threads_per_worker",
        "worker_cpus",
        "memory_budget_bytes",
        "worker_memory_bytes",
        "cache_budget_bytes",
        "allocator",
        "reasons",
    }
