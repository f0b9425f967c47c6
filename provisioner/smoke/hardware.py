"""Limits from the hardware: FP64 FLOPs per cycle from the CPU, the clock the peak is computed at,
and DRAM bandwidth from the DIMMs (docs/tuning.md, 'Smoke test limits').

Runs on the control node, over the raw result's "cpu" and "memory" (what the target read from
/proc/cpuinfo, cpufreq and SMBIOS) and the gemm workload's clock figures
(results.gemm.clock_mhz_under_load, clock_source, clock_loop).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def fp64_flops_per_cycle(vendor: str, family: int, model: int, flags: Iterable[str]) -> tuple[int, str]:
    """FP64 FLOPs per cycle and core from the vendor, family and ISA flags, with the reason."""
    f = set(flags)
    if vendor == "AuthenticAMD":
        if family >= 0x1A and "avx512f" in f:
            return 32, "Zen 5: two 512-bit FMA pipes (full-width AVX-512; mobile Zen 5 is double-pumped: half)"
        if family == 0x19 and "avx512f" in f:
            return 16, "Zen 4: AVX-512 double-pumped on 256-bit FMA pipes"
        if family >= 0x19 or (family == 0x17 and model >= 0x30):
            return 16, "Zen 2/3: two 256-bit FMA pipes"
        if "fma" in f:
            return 8, "Zen/Zen+: 256-bit FMA split over 128-bit pipes"
    if "avx512f" in f:
        return 32, "AVX-512 with two FMA units (Xeon Gold 6000/Platinum and newer; one-unit parts reach half)"
    if "avx2" in f and "fma" in f:
        return 16, "AVX2: two 256-bit FMA units"
    if "avx" in f:
        return 8, "AVX without FMA: a 256-bit add and a multiply per cycle"
    return 4, "SSE2: 128-bit add and multiply"


def _clock(raw: dict[str, Any], cores: str) -> tuple[float | None, str, str]:
    """(GHz, how it was measured, a short name for it) for the peak on "one" core or on "all"."""
    gemm = raw.get("results", {}).get("gemm", {})
    cpu = raw.get("cpu", {})
    under_load = gemm.get("clock_mhz_under_load")
    # Without a cpufreq driver the figure sampled under load is /proc/cpuinfo's nominal clock.
    if under_load and cpu.get("cpufreq", True):
        return under_load / 1000, gemm.get("clock_source", "measured under DGEMM load"), "measured under DGEMM load"
    loop = gemm.get("clock_loop") or {}
    counted = loop.get(cores) or {}
    if counted.get("mhz"):
        where = "one core alone" if cores == "one" else f"each of {len(counted.get('cpus', []))} core(s) at once, their median"
        how = f"counted right after the DGEMM runs, on {where}: {loop.get('method')} (no cpufreq driver reports the clock)"
        return counted["mhz"] / 1000, how, "counted on one core" if cores == "one" else "counted on all cores"
    why = loop.get("unavailable") or loop.get("error")
    note = f"; the clock could not be counted: {why}" if why else ""
    if under_load:
        return under_load / 1000, gemm.get("clock_source", "measured under DGEMM load") + note, "nominal"
    if cpu.get("max_mhz"):
        return cpu["max_mhz"] / 1000, "cpufreq cpuinfo_max_freq (not measured under load)" + note, "cpuinfo_max_freq"
    if cpu.get("nominal_mhz"):
        return cpu["nominal_mhz"] / 1000, "/proc/cpuinfo cpu MHz (nominal; not measured under load)" + note, "nominal"
    return None, "no clock known" + note, ""


def clock_ghz(raw: dict[str, Any], cores: str = "all") -> tuple[float | None, str]:
    """The clock the peak on `cores` ("all" or "one") is computed at, and which clock it is.

    In this order: the clock cpufreq reports under DGEMM load; the clock counted in cycles on
    that many cores right after the DGEMM runs (on hosts without a cpufreq driver, whose cores
    boost above the nominal clock); cpuinfo_max_freq; the nominal clock. Result files from
    before the counted clock judge as they did.
    """
    ghz, how, _name = _clock(raw, cores)
    return ghz, how


def dram_gbps(memory: dict[str, Any]) -> tuple[float | None, str]:
    """Theoretical DRAM bandwidth from the DIMMs, with how it was derived (or why it is unknown)."""
    dimms = memory.get("dimms") or []
    if not memory.get("source"):
        return None, f"DRAM bandwidth unknown: {memory.get('why', 'no SMBIOS data')}"
    speeds = [d.get("configured_mts") or d.get("rated_mts") for d in dimms]
    if not dimms or not all(speeds):
        return None, "DRAM bandwidth unknown: SMBIOS lists no DIMM speed (typical in virtual machines)"
    mts = min(speeds)
    gbps = len(dimms) * 8 * mts / 1000
    return gbps, f"{len(dimms)} DIMMs x 8 B x {mts} MT/s (configured), one DIMM per channel assumed"
