"""Serving: model-server workers, their CPU slices and memory budget (docs/tuning.md, 'Serving')."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from provisioner.constants import SERVING_WORKER_OVERHEAD_BYTES
from provisioner.plan.base import PlanError, Setting, _get, _gib, _memory_and_hugepages, _need
from provisioner.plan.options import PlanOptions

# The least model cache a worker may be left with (its memory minus what the worker needs itself).
SERVING_MIN_CACHE_BYTES = 256 * 1024**2


def serving_threads_per_worker(cores: int) -> int:
    """Threads per model-server worker for this many physical cores.  See docs/tuning.md, 'Serving'.

    One request is one small prediction: tree ensembles scale poorly past about 4 threads on
    one row or a small batch, and the HTTP layer of one Python process (its GIL) caps its own
    requests/s, so the cores are spent on workers first: 1 thread per worker up to 7 cores,
    2 from 8, 4 from 16."""
    if cores >= 16:
        return 4
    if cores >= 8:
        return 2
    return 1


def core_cpus(facts: Mapping[str, Any]) -> tuple[list[list[int]], str]:
    """The logical CPUs of each physical core, in core order, and where that came from.

    From the facts' ``cpu.core_cpus`` (sysfs sibling lists) when present; otherwise Linux's
    usual x86 numbering, where core k's SMT siblings are CPUs k, k + cores, k + 2 x cores."""
    cores = _need(facts, "cpu.cores")
    listed = _get(facts, "cpu.core_cpus")
    if isinstance(listed, list) and len(listed) == cores and all(isinstance(c, list) and c for c in listed):
        return [sorted(int(cpu) for cpu in core) for core in listed], "the sysfs sibling lists"
    threads = _get(facts, "cpu.threads", cores)
    smt = max(1, threads // cores)
    return [[k + i * cores for i in range(smt)] for k in range(cores)], "the usual numbering (no sibling lists in the facts)"


def plan_serving(facts: Mapping[str, Any], options: PlanOptions, settings: list[Setting], warnings: list[str]) -> dict[str, Any]:
    """Model-server workers, their CPU slices and the memory budget.  See docs/tuning.md, 'Serving'.

    workers x threads per worker = the physical cores (gunicorn issue 2873: N workers each
    starting N framework threads oversubscribe); each worker pinned to its own cores by
    CPUAffinity, since thread pools see the affinity mask but not a CPU quota (xgboost issue
    7653); the memory budget is a share of the RAM left after hugepages, split evenly, since
    every worker loads its own models after it starts (no fork after OpenMP: xgboost issue 8040)."""
    cores = _need(facts, "cpu.cores")
    slices, source = core_cpus(facts)
    reasons: list[str] = []
    if options.serving_threads_per_worker is not None:
        threads = options.serving_threads_per_worker
        threads_reason = f"{threads}: plan_serving_threads_per_worker"
    else:
        threads = min(serving_threads_per_worker(cores), cores)
        threads_reason = {
            1: "1 per worker below 8 cores: one row gains little from threads, a worker more adds requests/s",
            2: "2 per worker from 8 cores: batches gain from a second thread, workers still add requests/s",
            4: "4 per worker from 16 cores: tree models scale past 4 threads poorly on one row or a small batch",
        }[threads]
    if options.serving_workers is not None:
        workers = options.serving_workers
        workers_how = "plan_serving_workers"
    else:
        workers = max(1, cores // threads)
        workers_how = f"{cores} cores // {threads} thread(s) per worker"
    if workers * threads > cores:
        if not options.allow_oversubscription:
            raise PlanError(
                f"serving: {workers} workers x {threads} threads = {workers * threads} is more than the {cores} "
                "physical cores; lower plan_serving_workers or plan_serving_threads_per_worker, "
                "or set plan_allow_oversubscription: true"
            )
        warnings.append(f"serving: {workers} workers x {threads} threads on {cores} cores: oversubscribed by choice")
        worker_cpus = [sorted(c for core in slices for c in core) for _ in range(workers)]
        slice_reason = f"every worker on all {cores} cores: the slices would overlap (plan_allow_oversubscription)"
    else:
        worker_cpus = [sorted(c for core in slices[i * threads : (i + 1) * threads] for c in core) for i in range(workers)]
        idle = cores - workers * threads
        slice_reason = (
            f"each worker pinned (CPUAffinity) to its own {threads} core(s) and their SMT siblings, from {source}; "
            "thread pools see the affinity mask, not a CPU quota"
        )
        if idle:
            slice_reason += f"; {idle} core(s) left to the rest of the host"
    reasons.append(
        f"{workers}: {workers} worker(s) x {threads} thread(s) = {min(workers * threads, cores)} of {cores} cores "
        f"({workers_how}; N workers x N framework threads each would oversubscribe)"
    )
    reasons.append(threads_reason)
    reasons.append(slice_reason)

    total, reserved = _memory_and_hugepages(facts, settings, "the serving budget")
    budget = int((total - reserved) * options.serving_memory_share)
    per_worker = budget // workers
    cache = per_worker - SERVING_WORKER_OVERHEAD_BYTES
    after = f"{_gib(total)} RAM" + (f" - {_gib(reserved)} hugepages" if reserved else "")
    reasons.append(
        f"{budget}: {_gib(budget)} for the service, {options.serving_memory_share:g} of {after} "
        "(plan_serving_memory_share); "
        f"{_gib(per_worker)} per worker, each loading its own copy of the models"
    )
    if cache < SERVING_MIN_CACHE_BYTES:
        raise PlanError(
            f"serving: {_gib(per_worker)} per worker leaves {_gib(max(cache, 0))} for models after the "
            f"{_gib(SERVING_WORKER_OVERHEAD_BYTES)} a worker needs itself; use fewer workers "
            "(plan_serving_workers) or a larger plan_serving_memory_share"
        )
    reasons.append(
        f"{_gib(cache)} model cache per worker: {_gib(per_worker)} - {_gib(SERVING_WORKER_OVERHEAD_BYTES)} "
        "for the worker itself; versions beyond it are evicted least recently used first"
    )
    allocator = options.serving_allocator or "glibc"
    reasons.append(
        f"{allocator}: plan_serving_allocator (preloaded into each worker through role allocator's drop-in)"
        if options.serving_allocator is not None
        else "glibc: the system malloc; jemalloc (plan_serving_allocator) is an opt-in per service, "
        "worth it where a measurement shows it (provisioner tune; PyTorch CPU tuning guide)"
    )
    return {
        "workers": workers,
        "threads_per_worker": threads,
        "worker_cpus": worker_cpus,
        "memory_budget_bytes": budget,
        "worker_memory_bytes": per_worker,
        "cache_budget_bytes": cache,
        "allocator": allocator,
        "reasons": reasons,
    }
