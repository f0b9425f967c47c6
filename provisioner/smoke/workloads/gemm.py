"""DGEMM and SGEMM on all cores and on one, against the peak the CPU's FLOPs per cycle and clock give.

Measured on the target (WORKERS, in the ML environment); judged on the control node, which
reads results.gemm: n, dgemm_all/dgemm_one/sgemm_all/sgemm_one
({gflops, times_s, threads}), blas, kernel_check, and (through provisioner.smoke.hardware) the
clock figures; from the raw result cpu and threads.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import sys
import threading
import time
from typing import Any

from ..base import FAIL, INFO, PASS, Check, _problem, grade, span
from ..hardware import _clock, fp64_flops_per_cycle
from ..target.ml import _blas_threads, median
from ..target.probe import core_cpus, read

NAME = "gemm"
# The plan values whose change moves its figures: what the tuner may search (registry: KNOBS).
KNOBS: tuple[str, ...] = ("threads_per_job", "omp_proc_bind", "thp_enabled")


# ---------------------------------------------------------------- target, ML environment

SIZES: dict[str, dict[str, Any]] = {
    "quick": {"gemm_n": 2048, "gemm_repeats": 3},
    "full": {"gemm_n": 4096, "gemm_repeats": 5},
}


# x86-64: xor eax, eax; mov edx, 1; mov rcx, rdi; loop: LOOP_ADDS x (add rax, rdx); dec rcx; jnz loop; ret
# (rax: the adds). The adds form one dependent chain, one cycle each on every x86-64 core: adds / seconds is
# the clock. A register, not an immediate: newer Intel cores (Golden Cove on) fold chains of `add rax, 1` in
# the renamer, several a cycle, and the loop read 20 GHz on them.
LOOP_ADDS = 64
LOOP_SECONDS = 0.05  # one repeat
LOOP_REPEATS = 7
LOOP_METHOD = (
    f"a chain of dependent `add rax, rdx` (1 cycle each) over the thread's CPU time, fastest of "
    f"{LOOP_REPEATS} repeats of {LOOP_SECONDS * 1000:.0f} ms per core"
)


def _add_loop():
    """The cycle-counting loop as f(iterations) -> adds, or a string saying why there is none here."""
    import ctypes
    import mmap
    import struct

    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return f"the cycle-counting loop is x86-64 machine code and this CPU is {machine}"
    body = b"\x48\x01\xd0" * LOOP_ADDS + b"\x48\xff\xc9"
    code = b"\x31\xc0\xba\x01\x00\x00\x00\x48\x89\xf9" + body + b"\x0f\x85" + struct.pack("<i", -(len(body) + 6)) + b"\xc3"
    try:
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except OSError as exc:
        return (
            f"an executable memory mapping is refused ({exc.strerror or exc}: e.g. systemd's "
            "MemoryDenyWriteExecute or SELinux execmem)"
        )
    page.write(code)
    fn = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint64)(ctypes.addressof(ctypes.c_char.from_buffer(page)))

    def count(iterations: int, _page: mmap.mmap = page) -> int:  # the closure holds the page mapped
        adds = fn(iterations)
        if adds != iterations * LOOP_ADDS:
            raise RuntimeError(f"the cycle-counting loop returned {adds}, not {iterations * LOOP_ADDS}")
        return adds

    return count


def _loop_mhz(count, cpu: int, barrier=None) -> tuple[list[float], float]:
    """The clock of `cpu` in MHz once per repeat, and the share of the wall time the loop had the CPU.

    Adds over the thread's CPU time, not the wall time: another process taking the core away
    stops both the loop and its clock, so a busy host reads right (the share shows how busy).
    What that cannot hide (a hypervisor's steal, a busy SMT sibling) only ever makes a repeat
    read low: the chain cannot run faster than one add a cycle, so the fastest repeat is the
    clock. With a barrier, every process starts its repeats together.
    """
    os.sched_setaffinity(0, {cpu})
    n = 1000
    while True:  # size one repeat to LOOP_SECONDS
        t0 = time.perf_counter()
        count(n)
        dt = time.perf_counter() - t0
        if dt > LOOP_SECONDS / 10:
            break
        n *= 4
    n = max(1, int(n * LOOP_SECONDS / dt))
    if barrier is not None:
        barrier.wait()
    out, on_cpu = [], []
    for _ in range(LOOP_REPEATS):
        t0, c0 = time.perf_counter(), time.thread_time()
        adds = count(n)
        cpu_s, wall_s = time.thread_time() - c0, time.perf_counter() - t0
        out.append(adds / cpu_s / 1e6)
        on_cpu.append(cpu_s / wall_s)
    return out, round(median(on_cpu), 3)


def _loop_child(count, cpu: int, barrier, results) -> None:
    try:
        results.put((cpu, _loop_mhz(count, cpu, barrier)))
    except Exception as exc:  # the parent reports it
        barrier.abort()
        results.put((cpu, f"{type(exc).__name__}: {exc}"))


def w_clock(p: dict[str, Any]) -> dict[str, Any]:
    """The clock counted in cycles: on one core alone, then on every core of the all-core DGEMM at once.

    One process per physical core, pinned, started together; the all-core clock is the median
    of the cores' figures.
    """
    import multiprocessing as mp

    count = _add_loop()
    if isinstance(count, str):
        return {"unavailable": count}
    cpus = (core_cpus() or sorted(os.sched_getaffinity(0)))[: max(1, int(p["threads"]))]
    allowed = os.sched_getaffinity(0)
    try:
        one, one_on_cpu = _loop_mhz(count, cpus[0])
    finally:
        os.sched_setaffinity(0, allowed)
    ctx = mp.get_context("fork")  # this process runs no threads; the children inherit the loop's page
    barrier, results = ctx.Barrier(len(cpus)), ctx.SimpleQueue()
    procs = [ctx.Process(target=_loop_child, args=(count, cpu, barrier, results)) for cpu in cpus]
    for proc in procs:
        proc.start()
    got = dict(results.get() for _ in procs)
    for proc in procs:
        proc.join()
    failed = [f"cpu {cpu}: {v}" for cpu, v in got.items() if isinstance(v, str)]
    if failed:
        return {"error": f"clock: {failed[0]}"}
    per_core = [max(got[cpu][0]) for cpu in cpus]
    return {
        "method": LOOP_METHOD,
        "adds_per_iteration": LOOP_ADDS,
        "one": {"cpu": cpus[0], "mhz": max(one), "repeats_mhz": one, "on_cpu": one_on_cpu},
        "all": {
            "cpus": cpus,
            "mhz": median(per_core),
            "per_core_mhz": per_core,
            "repeats_mhz": [got[cpu][0] for cpu in cpus],
            "on_cpu": [got[cpu][1] for cpu in cpus],
        },
    }


def _limits(threads: int | None):
    """Limit every BLAS/OpenMP pool to `threads` (None: leave the library defaults)."""

    if threads is None:
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=threads)


def blas_kernel_verdict(info: list[dict[str, Any]]) -> dict[str, Any] | None:
    """mlstack-doctor's verdict on the BLAS kernels for this CPU (its kernel table is the one
    source), when the ML environment running this has the doctor; None elsewhere (a baseline)."""
    import importlib.machinery
    import importlib.util

    path = os.path.join(sys.prefix, "bin", "mlstack-doctor")
    if not os.path.isfile(path):
        return None
    loader = importlib.machinery.SourceFileLoader("mlstack_doctor", path)
    spec = importlib.util.spec_from_loader("mlstack_doctor", loader)
    if spec is None:
        return None
    doctor = importlib.util.module_from_spec(spec)
    loader.exec_module(doctor)
    with open(doctor.CPUINFO) as f:
        isa = doctor.isa_level(doctor.read_cpuinfo(f.read())["flags"])
    return doctor.check_blas_kernel(info, isa, dict(os.environ))


def w_gemm(p: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    from threadpoolctl import threadpool_info

    s = SIZES[p["profile"]]
    n = s["gemm_n"]
    tuned = p["mode"] == "tuned"
    info = threadpool_info()
    out: dict[str, Any] = {
        "n": n,
        "blas": [
            {k: i.get(k) for k in ("internal_api", "architecture", "num_threads", "version", "filepath")}
            for i in info
            if i.get("user_api") == "blas"
        ],
    }
    out["kernel_check"] = blas_kernel_verdict(info)
    for dtype in ("float64", "float32"):
        a = np.random.default_rng(1).standard_normal((n, n)).astype(dtype)
        b = np.random.default_rng(2).standard_normal((n, n)).astype(dtype)
        for label, threads in (("all", None), ("one", 1)):
            with _limits(threads):
                a @ b  # warm up: page in, spin up the pool
                times = []
                for _ in range(s["gemm_repeats"]):
                    t0 = time.perf_counter()
                    a @ b
                    times.append(time.perf_counter() - t0)
            key = f"{'d' if dtype == 'float64' else 's'}gemm_{label}"
            out[key] = {
                "gflops": 2 * n**3 / median(times) / 1e9,
                "times_s": times,
                "threads": threads if threads else (_blas_threads() if tuned else "library default"),
            }
    return out


WORKERS = {"gemm": w_gemm, "clock": w_clock}


# ---------------------------------------------------------------- target, root parent (stdlib)


def current_mhz() -> float | None:
    """The average clock of the usable CPUs now: cpufreq where it exists, else /proc/cpuinfo."""
    cpus = sorted(os.sched_getaffinity(0))
    values = []
    for cpu in cpus:
        khz = read(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq")
        if khz and khz.isdigit():
            values.append(int(khz) / 1000)
    if not values:
        for m in re.finditer(r"^cpu MHz\s*:\s*([\d.]+)", read("/proc/cpuinfo", "") or "", re.M):
            values.append(float(m.group(1)))
    return sum(values) / len(values) if values else None


class ClockSampler:
    """Samples the clock while a workload keeps the cores busy."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            mhz = current_mhz()
            if mhz:
                self.samples.append(mhz)

    def __enter__(self) -> ClockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def drive(runner: Any) -> dict[str, Any]:
    """DGEMM with the clock sampled under its load, then the clock counted in cycles."""
    with ClockSampler() as clock:
        result = runner.worker("gemm")
    result["clock_mhz_under_load"] = median(clock.samples) if clock.samples else None
    result["clock_source"] = (
        "cpufreq scaling_cur_freq under DGEMM load"
        if runner.cpu["cpufreq"]
        else "/proc/cpuinfo cpu MHz under DGEMM load (no cpufreq driver: the hypervisor's or firmware's "
        "nominal clock; boost may run above it)"
    )
    # Right after the DGEMM runs: the clock counted in cycles, on one core and on all at once.
    result["clock_loop"] = runner.worker("clock")
    return result


# ---------------------------------------------------------------- control node

# (pass at or above, warn at or above; below: fail) for figure / limit.
GEMM_GRADES = (0.6, 0.3)  # large DGEMM reaches 80-90% of peak; a Haswell kernel on AVX-512 reaches ~40%


def gemm_checks(raw: dict[str, Any], gemm: dict[str, Any]) -> list[Check]:
    titles = {
        "dgemm_all": "DGEMM, all cores",
        "dgemm_one": "DGEMM, one core",
        "sgemm_all": "SGEMM, all cores",
        "sgemm_one": "SGEMM, one core",
    }
    problem = _problem("compute.gemm", "compute", "GEMM", gemm)
    if problem:
        return [problem]
    cpu = raw.get("cpu", {})
    fpc, _fpc_basis = fp64_flops_per_cycle(cpu.get("vendor", ""), cpu.get("family", 0), cpu.get("model", 0), cpu.get("flags", []))
    clocks = {side: _clock(raw, side) for side in ("one", "all")}
    kernels = ", ".join(f"{b.get('internal_api')} {b.get('architecture')}" for b in gemm.get("blas", [])) or "unknown BLAS"
    verdict = gemm.get("kernel_check") or {}
    wrong_kernel = verdict.get("detail", "the BLAS kernel is wrong for this CPU") if verdict.get("status") == "fail" else ""
    out = []
    for key, title in titles.items():
        fig = gemm.get(key, {}).get("gflops")
        if fig is None:
            continue
        cores = 1 if key.endswith("_one") else int(raw.get("threads") or cpu.get("physical_cores") or 1)
        ghz, _how, clock_name = clocks["one" if key.endswith("_one") else "all"]
        per_cycle = fpc * (2 if key.startswith("s") else 1)
        cid = f"compute.{key}"
        detail = (
            f"n={gemm.get('n')}, median of {len(gemm[key].get('times_s', []))}, threads {gemm[key].get('threads')}, {kernels}"
        )
        if not ghz:
            out.append(
                Check(cid, "compute", title, INFO, "no clock known: reported without a ratio", fig, "GFLOPS", detail=detail)
            )
            continue
        limit = cores * per_cycle * ghz
        ratio = fig / limit
        status = grade(ratio, GEMM_GRADES)
        reason = f"{ratio:.0%} of peak"
        if wrong_kernel:
            # A kernel below the CPU's vectors is a fault whatever the ratio: an SSE kernel can
            # still reach half of a Zen 4 core's peak.
            status = FAIL
            reason += f"; {wrong_kernel}"
        elif ratio > 1.05 and clock_name.startswith("counted"):
            reason += ": above the peak at the counted clock, so the FLOPs/cycle assumed for this CPU are too low"
        elif ratio > 1.05:
            reason += ": above the peak at the assumed clock, so the cores run faster than it (boost)"
        elif status != PASS:
            reason += f"; large GEMMs reach 80-90%: check the BLAS kernel ({kernels}) and the thread count"
        basis = f"{cores} core(s) x {per_cycle} {'FP32' if key.startswith('s') else 'FP64'} FLOPs/cycle x {ghz:.2f} GHz ({clock_name}; the peak's derivation is in the header)"
        out.append(Check(cid, "compute", title, status, reason, fig, "GFLOPS", limit, basis, ratio, detail=detail))
    return out


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return gemm_checks(raw, result)


def spreads(gemm: dict[str, Any]) -> dict[str, list[float] | None]:
    """GFLOPS of each repeat: 2 n^3 FLOPs over its time."""
    out: dict[str, list[float] | None] = {}
    for key in ("dgemm_all", "dgemm_one", "sgemm_all", "sgemm_one"):
        times = (gemm.get(key) or {}).get("times_s") or []
        if gemm.get("n") and all(times):
            out[f"compute.{key}"] = span([2 * gemm["n"] ** 3 / t / 1e9 for t in times])
    return out
