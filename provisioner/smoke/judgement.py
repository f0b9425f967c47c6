"""Raw figures of one host -> its checks: the host's own checks, then each registered workload that
ran (provisioner.smoke.workloads.WORKLOADS, in order), then the cost view, each check given its
repeats' spread; and the hardware the limits were derived from.

Runs on the control node. Reads the raw result's results (one entry per workload that ran, by
its name), mode, cpu, memory, threads, trials, kernel, python, user, data_dir, host, profile,
started, seconds, cpu_busy_before and cost.
"""

from __future__ import annotations

from typing import Any

from .base import Check, HostReport
from .config import config_checks, load_check
from .cost import cost_checks
from .hardware import clock_ghz, fp64_flops_per_cycle
from .workloads import WORKLOADS
from .workloads.serving import serving_curve


def evaluate(raw: dict[str, Any]) -> HostReport:
    """Raw figures of one host -> its checks."""
    results = raw.get("results", {})
    checks: list[Check] = [load_check(raw)] if raw.get("cpu_busy_before") is not None else []
    if raw.get("mode") == "tuned":
        checks += config_checks(raw)
    # Only the workloads that ran (smoke_workloads may choose some) get checks.
    for workload in WORKLOADS:
        if workload.NAME in results:
            checks += workload.checks(raw, results[workload.NAME])
    checks += cost_checks(raw.get("cost") or {}, checks)
    spreads = repeat_spreads(results)
    for c in checks:
        c.spread = spreads.get(c.id)
    ghz, clock_basis = clock_ghz(raw)
    one_ghz, _one_basis = clock_ghz(raw, "one")
    if one_ghz and ghz and round(one_ghz, 2) != round(ghz, 2):
        clock_basis += f"; one core: {one_ghz:.2f} GHz, the one-core peak's clock"
    cpu = raw.get("cpu", {})
    fpc, fpc_basis = fp64_flops_per_cycle(cpu.get("vendor", ""), cpu.get("family", 0), cpu.get("model", 0), cpu.get("flags", []))
    hardware = {
        "cpu": cpu.get("model_name"),
        "physical_cores": cpu.get("physical_cores"),
        "logical_cpus": cpu.get("logical_cpus"),
        "threads": raw.get("threads"),
        "trials": raw.get("trials"),
        "clock_ghz": round(ghz, 3) if ghz else None,
        "clock_basis": clock_basis,
        "clock_one_ghz": round(one_ghz, 3) if one_ghz else None,
        "fp64_flops_per_cycle": fpc,
        "fp64_basis": fpc_basis,
        "memory_gib": round(raw.get("memory", {}).get("total_bytes", 0) / 2**30, 1),
        "kernel": raw.get("kernel"),
        "python": raw.get("python"),
        "user": raw.get("user"),
        "data_dir": raw.get("data_dir"),
    }
    curve = serving_curve(results.get("serving") or {})
    return HostReport(
        host=raw.get("host", "?"),
        mode=raw.get("mode", "tuned"),
        profile=raw.get("profile", "quick"),
        started=raw.get("started", ""),
        seconds=float(raw.get("seconds", 0.0)),
        hardware=hardware,
        checks=checks,
        raw=raw,
        workloads={task: float(r.get("seconds", 0.0)) for task, r in results.items() if isinstance(r, dict)},
        curves={raw.get("mode", "tuned"): curve} if curve else {},
    )


def repeat_spreads(results: dict[str, Any]) -> dict[str, list[float]]:
    """Lowest and highest figure over each workload's repeats (the run's own noise)."""
    out: dict[str, list[float] | None] = {}
    for workload in WORKLOADS:
        spreads = getattr(workload, "spreads", None)
        if spreads is not None:
            out.update(spreads(results.get(workload.NAME) or {}))
    return {k: v for k, v in out.items() if v}
