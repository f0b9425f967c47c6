"""Every concern in order: facts + options -> :class:`Plan`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from provisioner.plan.base import Plan, PlanError, Setting, _get, check_facts
from provisioner.plan.memory import plan_feature_matrix, plan_hugepages, plan_reboot, plan_thp
from provisioner.plan.options import PlanOptions
from provisioner.plan.ray import plan_ray
from provisioner.plan.serving import plan_serving
from provisioner.plan.storage import plan_storage
from provisioner.plan.system import plan_cpufreq, plan_os, plan_runtimes
from provisioner.plan.threads import plan_dataloader, plan_runtime_threads, plan_threads

CONCERNS: tuple[Callable[[Mapping[str, Any], PlanOptions, list[str]], list[Setting]], ...] = (
    plan_threads,
    plan_runtime_threads,
    plan_dataloader,
    plan_thp,
    plan_hugepages,
    plan_cpufreq,
    plan_os,
    plan_runtimes,
)


def derive_plan(facts: Mapping[str, Any], options: PlanOptions | None = None) -> Plan:
    """Facts + options -> Plan.  Raises PlanError (one line) for bad input.
    The virtualization warning: docs/tuning.md, 'Virtualization'."""
    options = options if options is not None else PlanOptions()
    check_facts(facts)
    warnings: list[str] = []
    settings: list[Setting] = []
    for concern in CONCERNS:
        settings.extend(concern(facts, options, warnings))
    settings.append(plan_reboot(settings))
    settings.extend(plan_feature_matrix(facts, options, settings, warnings))
    settings.extend(plan_ray(facts, options, settings, warnings))
    storage = plan_storage(facts, options, warnings)
    serving = plan_serving(facts, options, settings, warnings)
    settings.extend(
        [
            Setting("serving_workers", serving["workers"], serving["reasons"][0]),
            Setting("serving_threads_per_worker", serving["threads_per_worker"], serving["reasons"][1]),
            Setting("serving_memory_budget_bytes", serving["memory_budget_bytes"], serving["reasons"][3]),
            Setting("serving_allocator", serving["allocator"], serving["reasons"][5]),
        ]
    )
    virt = _get(facts, "virtualization.type", "none")
    if virt not in (None, "none"):
        warnings.append(f"virtualized ({virt}): clocks, NUMA and drives belong to the host; figures may vary")
    return Plan(settings=mark_tuned(settings, options), storage=storage, warnings=warnings, serving=serving)


def mark_tuned(settings: list[Setting], options: PlanOptions) -> list[Setting]:
    """The settings plan_tuned names, their reason led by "tuned: EVIDENCE; " (what `provisioner
    tune --write` measured for the value its plan_<key> option now sets). A name that is no value
    of the plan is refused, naming the values. See docs/tuning.md, 'Tuned values'."""
    evidence = options.tuned_evidence
    keys = [s.key for s in settings]
    unknown = [key for key in evidence if key not in keys]
    if unknown:
        raise PlanError(f"plan_tuned names {', '.join(unknown)}, not a value of the plan; the plan's values: {', '.join(keys)}")
    return [Setting(s.key, s.value, f"tuned: {evidence[s.key]}; {s.reason}") if s.key in evidence else s for s in settings]
