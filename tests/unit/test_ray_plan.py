"""Ray sizing in the plan: num_cpus, the object store, task memory and a trial's CPUs, for every
fixture of tests/fixtures/facts, each value with its reason."""

from __future__ import annotations

import pytest
from facts_fixtures import FIXTURES, load

from provisioner.plan import (
    GIB,
    RAY_SYSTEM_MIN_BYTES,
    RAY_SYSTEM_SHARE,
    PlanError,
    PlanOptions,
    derive_plan,
    plan_ray,
)

NAMES = sorted(p.stem for p in FIXTURES.glob("*.json"))


@pytest.mark.parametrize("name", NAMES)
def test_ray_uses_the_physical_cores_and_a_share_of_the_ram(name):
    f = load(name)
    plan = derive_plan(f)
    cores, total = f["cpu"]["cores"], f["memory"]["total_bytes"]
    assert plan.value("ray_num_cpus") == cores
    store = plan.value("ray_object_store_bytes")
    assert store == int(total * 0.3)
    system = max(int(total * RAY_SYSTEM_SHARE), RAY_SYSTEM_MIN_BYTES)
    assert plan.value("ray_memory_bytes") == total - store - system
    assert plan.value("ray_trial_cpus") == 1
    for key in ("ray_num_cpus", "ray_object_store_bytes", "ray_memory_bytes", "ray_trial_cpus"):
        assert plan.reason(key).startswith(f"{plan.value(key)}:"), key


def test_smt_siblings_are_not_ray_cpus():
    f = load("xeon_2s")
    assert f["cpu"]["threads"] > f["cpu"]["cores"], "the fixture has SMT"
    plan = derive_plan(f)
    assert plan.value("ray_num_cpus") == f["cpu"]["cores"]
    assert f"{f['cpu']['threads']} logical CPUs" in plan.reason("ray_num_cpus")


def test_hugepages_come_out_of_the_object_store_and_task_memory():
    f = load("epyc_4545p")
    total = f["memory"]["total_bytes"]
    plain = derive_plan(f)
    pages = derive_plan(f, PlanOptions(hugepages_size="1G", hugepages_count=32))
    after = total - 32 * GIB
    assert pages.value("ray_object_store_bytes") == int(after * 0.3) < plain.value("ray_object_store_bytes")
    assert "hugepages" in pages.reason("ray_object_store_bytes")
    assert pages.value("ray_memory_bytes") < plain.value("ray_memory_bytes")


def test_the_share_is_an_option():
    f = load("laptop_4c")
    plan = derive_plan(f, PlanOptions.from_vars({"plan_ray_object_store_share": "0.1"}))
    assert plan.value("ray_object_store_bytes") == int(f["memory"]["total_bytes"] * 0.1)


def test_too_little_memory_is_refused_naming_the_fix():
    f = load("vm_2vcpu")
    f["memory"]["total_bytes"] = 200 * 1024**2
    with pytest.raises(PlanError, match=r"below Ray's smallest object store.*raise plan_ray_object_store_share"):
        plan_ray(f, PlanOptions(), [], [])
    f["memory"]["total_bytes"] = 2 * GIB
    with pytest.raises(PlanError, match=r"leaves .* for tasks.*lower plan_ray_object_store_share"):
        plan_ray(f, PlanOptions(ray_object_store_share=0.6), [], [])
