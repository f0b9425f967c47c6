"""Ray: a node's CPUs, object store and task memory, and one trial's CPUs (docs/ray.md, 'Sizing');
the memory is sized by the RAM as every memory-derived value is (docs/tuning.md, 'Memory')."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from provisioner.plan.base import GIB, PlanError, Setting, _get, _gib, _human_bytes, _memory_and_hugepages, _need
from provisioner.plan.options import PlanOptions

# Ray's smallest object store.
RAY_MIN_OBJECT_STORE_BYTES = 75 * 1024**2
# RAM kept out of Ray's task memory for the system and Ray's own processes: a share, and a floor.
RAY_SYSTEM_SHARE = 0.1
RAY_SYSTEM_MIN_BYTES = GIB


def plan_ray(facts: Mapping[str, Any], options: PlanOptions, settings: list[Setting], warnings: list[str]) -> list[Setting]:
    """A Ray node's CPUs, object store and task memory, and the CPUs of one trial.  See docs/ray.md, 'Sizing'.

    num_cpus is the physical cores: Ray counts logical CPUs by default, and a task's reservation
    becomes its OMP_NUM_THREADS, so SMT siblings would double the threads the BLAS and tree
    libraries start. The object store is a share of the RAM left after hugepages (Ray's own
    default is 30% of what is available; hugepages cannot back /dev/shm); the rest, less what the
    system and Ray's own processes keep, is the memory tasks may reserve."""
    cores = _need(facts, "cpu.cores")
    threads = _get(facts, "cpu.threads", cores)
    total, reserved = _memory_and_hugepages(facts, settings, "the Ray object store")
    after = total - reserved
    store = int(after * options.ray_object_store_share)
    after_text = f"{_gib(total)} RAM" + (f" - {_gib(reserved)} hugepages" if reserved else "")
    if store < RAY_MIN_OBJECT_STORE_BYTES:
        raise PlanError(
            f"ray: {options.ray_object_store_share:g} of {after_text} is {_human_bytes(store)}, below Ray's smallest "
            f"object store ({_human_bytes(RAY_MIN_OBJECT_STORE_BYTES)}); raise plan_ray_object_store_share or reserve fewer hugepages"
        )
    system = max(int(after * RAY_SYSTEM_SHARE), RAY_SYSTEM_MIN_BYTES)
    memory = after - store - system
    if memory < 512 * 1024**2:
        raise PlanError(
            f"ray: {after_text} leaves {_human_bytes(max(memory, 0))} for tasks after the "
            f"{_human_bytes(store)} object store and {_human_bytes(system)} for the system; "
            "lower plan_ray_object_store_share or reserve fewer hugepages"
        )
    smt = f", SMT siblings not counted ({threads} logical CPUs)" if threads > cores else ""
    return [
        Setting(
            "ray_num_cpus",
            cores,
            f"{cores}: the physical cores{smt}; Ray hands a task's reserved CPUs to it as OMP_NUM_THREADS "
            "(Ray resource docs; ray issue 28594)",
        ),
        Setting(
            "ray_object_store_bytes",
            store,
            f"{store}: {_gib(store)}, {options.ray_object_store_share:g} of {after_text} (plan_ray_object_store_share; "
            "Ray's default is 0.3 of the available memory); hugepages cannot back /dev/shm, and the role caps it "
            "at /dev/shm's size, since Ray falls back to a slow store on disk above it (ray PR 3149)",
        ),
        Setting(
            "ray_memory_bytes",
            memory,
            f"{memory}: {_gib(memory)} for tasks, {after_text} - {_gib(store)} object store - {_gib(system)} "
            f"for the system and Ray's own processes ({RAY_SYSTEM_SHARE:g} of it, at least {_gib(RAY_SYSTEM_MIN_BYTES)})",
        ),
        Setting(
            "ray_trial_cpus",
            1,
            "1: one CPU per distributed trial, so each trial runs one thread and a node runs one trial per core "
            "(the parallel-trials rule of 'Threads': small trials scale by processes, not threads)",
        ),
    ]
