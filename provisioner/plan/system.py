"""The host around the jobs: CPU frequency, the tuned profile, swappiness and NUMA balancing, BLAS
and the OpenMP runtime (docs/tuning.md, 'CPU frequency', 'Operating system' and 'Runtimes')."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from provisioner.plan.base import Setting, _get
from provisioner.plan.options import PlanOptions


def plan_cpufreq(facts: Mapping[str, Any], options: PlanOptions, warnings: list[str]) -> list[Setting]:
    """Governor, EPP, boost.  See docs/tuning.md, 'CPU frequency'."""
    driver = _get(facts, "cpufreq.driver")
    virt = _get(facts, "virtualization.vm") or _get(facts, "virtualization.type", "none")
    if not driver:
        why = "not applicable: no cpufreq driver"
        if virt not in (None, "none"):
            why += f" ({virt} guest: the host sets the clocks)"
        return [
            Setting("cpu_governor", None, why),
            Setting("energy_performance_preference", None, why),
            Setting("cpu_boost", None, why),
        ]
    available = _get(facts, "cpufreq.available_governors", []) or []
    if available and "performance" not in available:
        governor = Setting(
            "cpu_governor", None, f"not applicable: driver {driver} offers no performance governor ({', '.join(available)})"
        )
    else:
        governor = Setting(
            "cpu_governor",
            "performance",
            f"performance: full clocks under bursty load (kernel amd-pstate docs); driver {driver}",
        )
    if _get(facts, "cpufreq.epp") is not None:
        epp = Setting(
            "energy_performance_preference",
            "performance",
            f"performance: {driver} has EPP; favour clocks over power (kernel amd-pstate docs)",
        )
    else:
        epp = Setting("energy_performance_preference", None, f"not applicable: driver {driver} has no EPP")
    if driver == "amd-pstate" and _get(facts, "cpufreq.amd_pstate_status") not in (None, "active"):
        warnings.append("amd-pstate is not in active mode (amd_pstate=active on the kernel command line gives EPP)")
    if _get(facts, "cpufreq.boost") is None:
        boost = Setting("cpu_boost", None, f"not applicable: driver {driver} exposes no boost control")
    else:
        boost = Setting("cpu_boost", True, "true: boost on for full clocks (kernel amd-pstate docs)")
    return [governor, epp, boost]


TUNED_REASONS = {
    "throughput-performance": "sets governor, EPP, min_perf_pct=100, swappiness 10, readahead >= 4096 KiB",
    "hpc-compute": "throughput-performance plus THP=always, numa_balancing=0, zone_reclaim_mode=1",
    "latency-performance": "for inference endpoints: governor performance and no deep C-states; less throughput tuning",
}


def plan_os(facts: Mapping[str, Any], options: PlanOptions, warnings: list[str]) -> list[Setting]:
    """tuned profile, swappiness, NUMA balancing.  See docs/tuning.md, 'Operating system'."""
    profile = options.tuned_profile
    default = " (default)" if profile == "throughput-performance" else " (plan_tuned_profile)"
    settings = [
        Setting(
            "tuned_profile",
            profile,
            f"{profile}{default}: {TUNED_REASONS[profile]} (redhat-performance/tuned profiles)",
        ),
        Setting("swappiness", 10, "10: keep anonymous ML memory resident (tuned throughput-performance)"),
    ]
    nodes = _get(facts, "cpu.numa_nodes", 1)
    reasons = {
        None: "not applicable: 1 NUMA node",
        0: f"0: {nodes} NUMA nodes, tuned hpc-compute pins instead of migrating",
        1: f"1: {nodes} NUMA nodes; the kernel moves memory to unpinned jobs (pin per node "
        "only for pinned jobs; AMD EPYC tuning guides)",
    }
    value = numa_balancing(nodes, profile)
    settings.append(Setting("numa_balancing", value, reasons[value]))
    return settings


def numa_balancing(nodes: int, profile: str) -> int | None:
    """kernel.numa_balancing for NODES NUMA nodes under tuned PROFILE: None (left alone) on one
    node, 0 where hpc-compute pins, else 1.  cpu_tuning's standalone default applies this rule
    through the filter provisioner_numa_balancing."""
    if nodes <= 1:
        return None
    return 0 if profile == "hpc-compute" else 1


def plan_runtimes(facts: Mapping[str, Any], options: PlanOptions, warnings: list[str]) -> list[Setting]:
    """BLAS, OpenMP runtime, KMP_*, binding, allocator.  See docs/tuning.md, 'Runtimes'."""
    vendor = _get(facts, "cpu.vendor", "unknown")
    if vendor == "AuthenticAMD":
        blas = Setting(
            "blas",
            "openblas",
            "openblas: OpenBLAS has Zen 4 AVX-512 kernels; MKL only as a measured opt-in, since "
            "MKL_DEBUG_CPU_TYPE was removed in MKL 2020.1 and MKL_ENABLE_INSTRUCTIONS does nothing on "
            "AMD (OpenBLAS PR 4303; Intel oneMKL docs)",
        )
    elif vendor == "GenuineIntel":
        blas = Setting(
            "blas",
            "mkl",
            "mkl: torch bundles MKL and oneDNN on Intel; numpy/scipy wheels keep their OpenBLAS "
            "(blas_numpy); scikit-learn-intelex optional (Intel docs)",
        )
    else:
        blas = Setting("blas", "openblas", f"openblas: no vendor BLAS for {vendor}; numpy/scipy wheels bundle it")
    return [
        blas,
        Setting("blas_numpy", "openblas", "openblas: the BLAS bundled in the numpy/scipy wheels"),
        Setting(
            "openmp_runtime",
            "libgomp",
            "libgomp: the GNU OpenMP of the torch, xgboost, lightgbm and OpenBLAS wheels; one runtime, "
            "never libgomp and libiomp mixed (threadpoolctl warns)",
        ),
        Setting(
            "kmp_blocktime",
            None,
            "not applicable: KMP_BLOCKTIME/KMP_AFFINITY only where Intel OpenMP (libiomp) is the runtime (IPEX tuning guide)",
        ),
        Setting(
            "omp_proc_bind",
            None,
            "not exported system-wide: OMP_PROC_BIND=close/OMP_PLACES=cores only for a single pinned job, "
            "or every process pins to the same cores (PyTorch tuning guide)",
        ),
        Setting(
            "allocator",
            None,
            "system malloc: jemalloc/tcmalloc via LD_PRELOAD is an opt-in per service (PyTorch tuning guide)",
        ),
    ]
