"""The smoke test's judgement: raw figures from a host -> checks against the hardware's limits.

Pure functions (evaluate, peak derivation, regression and baseline comparison) plus the
small history store under the state directory; `provisioner.commands.smoke` runs the
playbook and `provisioner.report` renders the HTML. The figures come from
roles/smoke/files/provisioner_smoke.py on the target; limits and their derivation follow
docs/tuning.md, 'Smoke test limits' (which also gives each grade's reason and source):

- compute peak = cores x FP64 FLOPs/cycle x clock (FP32: twice), the clock measured under
  DGEMM load where a cpufreq driver reports it, else counted in cycles by a dependent-add loop
  on one core (the one-core peak) and on all cores at once (the all-core peak), else the
  nominal clock (and the report says which, and why);
- DRAM = channels x 8 B x MT/s from the DIMMs' configured speed (one DIMM per channel assumed),
  else no ratio;
- a GBDT's all-core rate against its one-core rate times the cores (linear scaling);
- a PyTorch MLP step against torch's own SGEMM rate, measured in the same process;
- N parallel trials against the same trials run one after another;
- a Parquet scan against the same file read raw from the same mount (and the decode rate);
- single-row predict latency against what an endpoint can afford;
- the model server under HTTP load (wrk at 1, 8 and 32 connections): requests/s at 8 against
  the in-process predict rate through the server's own loader times the physical cores (the
  ratio is what the HTTP layer costs), p99 against what an endpoint can afford, and no failed
  request at any level;
- with the host's monthly price, the measured throughput as $ per million predictions and $ per
  trial, next to cloud instances of the same class (docs/tuning.md, 'Cost').
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import paths
from .errors import ExitCode
from .runs import RunResult

PASS, WARN, FAIL, SKIP, INFO = "pass", "warn", "fail", "skip", "info"
_RANK = {PASS: 0, INFO: 0, SKIP: 0, WARN: 1, FAIL: 2}

# A figure that falls more than this below the host's last run of the same kind is a regression.
REGRESSION = 0.15
# Figures that only illustrate (the oversubscribed run shows what the thread plan saves):
# neither a regression nor a before -> after gain is read from them.
ILLUSTRATIONS = frozenset({"hpo.oversubscribed", "host.load"})

# (pass at or above, warn at or above; below: fail) for figure / limit.
GEMM_GRADES = (0.6, 0.3)  # large DGEMM reaches 80-90% of peak; a Haswell kernel on AVX-512 reaches ~40%
TRIAD_GRADES = (0.6, 0.0)  # STREAM triad 74-82% of DRAM; the channel count is assumed: never a fail
GBDT_GRADES = (0.3, 0.15)  # 1 -> 16 cores: only 5-7x (memory-bound); below 0.15 extra threads are wasted
MLP_GRADES = (0.4, 0.2)  # an MLP step is mostly GEMMs; below 0.2 the threads or the kernel are wrong
HPO_GRADES = (0.9, 0.7)  # N processes of cores/N threads should at least match one-after-another
PARQUET_GRADES = (0.5, 0.2)
# RandomForest trees are independent: all cores should reach half of the one-core fit x cores.
SKLEARN_FOREST_GRADES = (0.5, 0.25)
# GridSearchCV on loky workers against the same search one fit after another, x the workers.
SKLEARN_GRID_GRADES = (0.5, 0.25)
# Polars' feature pipeline on all threads against its one-thread rate x the threads (joins and
# group-bys are memory-bound, like GBDT histograms).
FEATURES_GRADES = (0.3, 0.15)
# Cross-validation over the in-RAM feature matrix: its Gram matrices are GEMMs.
MATRIX_GRADES = (0.4, 0.2)
# A DataLoader feeding training against the same training on batches in memory (the workers and
# the training threads share the cores: half of it passes); the share of
# the loop spent waiting for the next batch (pass within, warn within, in %).
LOADER_GRADES = (0.5, 0.25)
LOADER_WAIT_PCT = (20.0, 50.0)
# Single-row predict: p99 within 2 ms passes (endpoints answer in 1-20 ms), within 10 ms warns.
LATENCY_P99_US = (2000.0, 10000.0)
# The model server at SERVING_CONNECTIONS concurrent connections: requests/s against the
# in-process predict rate x the physical cores (pass, warn); p99 in ms (pass within, warn within).
SERVING_CONNECTIONS = 8
SERVING_GRADES = (0.2, 0.08)
SERVING_P99_MS = (20.0, 50.0)
# The cost view: a month of a host's price is this many hours; cost checks follow the figure
# named here (their before -> after is that figure's, at this run's price).
HOURS_PER_MONTH = 730.0
COST_SOURCES = {"cost.serving.": "serving.rps", "cost.hpo.": "hpo.parallel"}
# More than this share of the CPUs busy just before the run: the host was not idle.
BUSY_SHARE = 0.25
# Parquet decode with snappy, per core (measured on these machines).
SNAPPY_DECODE_GBPS_PER_CORE = 1.4


@dataclass
class Check:
    id: str
    group: str
    title: str
    status: str
    reason: str
    figure: float | None = None
    unit: str = ""
    limit: float | None = None
    basis: str = ""
    ratio: float | None = None
    higher_is_better: bool = True
    detail: str = ""
    baseline: float | None = None
    gain: float | None = None  # after / before, >1 is better whichever way the figure points
    previous: float | None = None
    regression: bool = False
    spread: list[float] | None = None  # lowest and highest of this run's repeats, in the figure's unit


@dataclass
class HostReport:
    host: str
    mode: str
    profile: str
    started: str
    seconds: float
    hardware: dict[str, Any]
    checks: list[Check]
    baseline_started: str | None = None
    previous_started: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    workloads: dict[str, float] = field(default_factory=dict)  # seconds each workload took
    # Latency against load of the model server, per mode ("tuned", "baseline"): one point per
    # connection level, {connections, requests_per_s, p50_ms, p99_ms}.
    curves: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return max((c.status for c in self.checks), key=lambda s: _RANK[s], default=PASS)

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in (PASS, WARN, FAIL, SKIP, INFO)}
        for c in self.checks:
            out[c.status] += 1
        return out

    def to_dict(self, raw: bool = False) -> dict[str, Any]:
        d = {
            "host": self.host,
            "mode": self.mode,
            "profile": self.profile,
            "started": self.started,
            "seconds": self.seconds,
            "status": self.status,
            "counts": self.counts(),
            "hardware": self.hardware,
            "workloads": self.workloads,
            "curves": self.curves,
            "baseline_started": self.baseline_started,
            "previous_started": self.previous_started,
            "checks": [asdict(c) for c in self.checks],
        }
        if raw:
            d["raw"] = self.raw
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HostReport:
        return cls(
            host=d["host"],
            mode=d["mode"],
            profile=d["profile"],
            started=d["started"],
            seconds=d["seconds"],
            hardware=d.get("hardware", {}),
            checks=[Check(**c) for c in d.get("checks", [])],
            baseline_started=d.get("baseline_started"),
            previous_started=d.get("previous_started"),
            raw=d.get("raw", {}),
            workloads=d.get("workloads", {}),
            curves=d.get("curves", {}),
        )


# ---------------------------------------------------------------- limits from the hardware


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


def number(value: float | None) -> str:
    """A figure as people read it: whole numbers from 100 up, else three significant digits."""
    if value is None:
        return ""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3g}"


def grade(ratio: float, grades: tuple[float, float]) -> str:
    ok, warn = grades
    return PASS if ratio >= ok else WARN if ratio >= warn else FAIL


# ---------------------------------------------------------------- evaluation


def evaluate(raw: dict[str, Any]) -> HostReport:
    """Raw figures of one host -> its checks."""
    results = raw.get("results", {})
    checks: list[Check] = [load_check(raw)] if raw.get("cpu_busy_before") is not None else []
    if raw.get("mode") == "tuned":
        checks += config_checks(raw)
    # Only the workloads that ran (smoke_workloads may choose some) get checks.
    checks += gemm_checks(raw, results["gemm"]) if "gemm" in results else []
    checks += [triad_check(raw, results["triad"])] if "triad" in results else []
    checks += gbdt_checks(raw, results["gbdt"]) if "gbdt" in results else []
    checks += mlp_checks(raw, results["mlp"]) if "mlp" in results else []
    checks += hpo_checks(raw, results["hpo"]) if "hpo" in results else []
    checks += [parquet_check(raw, results["parquet"])] if "parquet" in results else []
    checks += inference_checks(results["inference"]) if "inference" in results else []
    checks += serving_checks(raw, results["serving"]) if "serving" in results else []
    checks += sklearn_checks(raw, results["sklearn"]) if "sklearn" in results else []
    checks += features_checks(raw, results["features"]) if "features" in results else []
    checks += matrix_checks(raw, results["matrix"]) if "matrix" in results else []
    checks += dataloader_checks(raw, results["dataloader"]) if "dataloader" in results else []
    checks += tensorflow_checks(raw, results["tensorflow"]) if "tensorflow" in results else []
    checks += cluster_checks(results["cluster"]) if "cluster" in results else []
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

    def span(values: list[float]) -> list[float] | None:
        return [min(values), max(values)] if len(values) > 1 else None

    gemm = results.get("gemm") or {}
    for key in ("dgemm_all", "dgemm_one", "sgemm_all", "sgemm_one"):
        times = (gemm.get(key) or {}).get("times_s") or []
        if gemm.get("n") and all(times):
            out[f"compute.{key}"] = span([2 * gemm["n"] ** 3 / t / 1e9 for t in times])
    triad = results.get("triad") or {}
    if triad.get("bytes_moved") and all(triad.get("times_s") or [0]):
        out["memory.triad"] = span([triad["bytes_moved"] / t / 1e9 for t in triad["times_s"]])
    mlp = results.get("mlp") or {}
    if mlp.get("step_s") and mlp.get("gflops"):
        mid = statistics.median(mlp["step_s"])
        out["torch.mlp"] = span([mlp["gflops"] * mid / t for t in mlp["step_s"]])
    pq = results.get("parquet") or {}
    if pq.get("file_bytes") and pq.get("scan_s"):
        out["data.parquet"] = span([pq["file_bytes"] / t / 1e9 for t in pq["scan_s"]])
    inf = results.get("inference") or {}
    for q in ("p50", "p99"):
        if inf.get(f"{q}_us_each"):
            out[f"inference.{q}"] = span(inf[f"{q}_us_each"])
    fe = (results.get("features") or {}).get("polars") or {}
    if fe.get("times_s") and all(fe["times_s"]):
        out["features.polars"] = span([results["features"]["rows"] / t / 1e6 for t in fe["times_s"]])
    forest = ((results.get("sklearn") or {}).get("forest") or {}).get("all") or {}
    if forest.get("times_s") and all(forest["times_s"]):
        sk = results["sklearn"]
        out["sklearn.forest"] = span([sk["rows"] * sk["trees"] / t / 1e6 for t in forest["times_s"]])
    level = serving_level(results.get("serving") or {})
    for key, cid in (("requests_per_s", "serving.rps"), ("p99_ms", "serving.p99")):
        values = [r[key] for r in (level or {}).get("runs", []) if r.get(key) is not None]
        out[cid] = span(values)
    return {k: v for k, v in out.items() if v}


def _problem(check_id: str, group: str, title: str, result: dict[str, Any]) -> Check | None:
    """A check for a workload that could not run (skipped) or failed, else None."""
    if "skipped" in result:
        return Check(check_id, group, title, SKIP, result["skipped"])
    if "error" in result:
        return Check(check_id, group, title, FAIL, f"the workload failed: {result['error']}")
    return None


def load_check(raw: dict[str, Any]) -> Check:
    """Whether other work ran on the CPUs: it lowers every figure without anything being wrong."""
    busy = float(raw["cpu_busy_before"])
    cpus = int(raw.get("cpu", {}).get("logical_cpus") or 1)
    status = PASS if busy <= BUSY_SHARE else WARN
    reason = f"{busy:.0%} of {cpus} CPUs busy in the second before the run"
    if status == WARN:
        reason += ": other work was running, so the figures below may be low for reasons outside this host's tuning"
    return Check(
        "host.load",
        "host",
        "idle host",
        status,
        reason,
        busy * 100,
        "% busy",
        BUSY_SHARE * 100,
        "/proc/stat over one second before the first workload",
        busy / BUSY_SHARE,
        higher_is_better=False,
    )


def config_checks(raw: dict[str, Any]) -> list[Check]:
    cfg, plan = raw.get("config", {}), raw.get("plan", {})
    threads = plan.get("threads_per_job")
    out = []
    for key, title in (
        ("login_shell", "thread settings in a login shell"),
        ("systemd_service", "thread settings in a systemd service"),
    ):
        seen = cfg.get(key, {})
        cid = f"config.threads.{key}"
        if "not_applicable" in seen:
            out.append(Check(cid, "configuration", title, SKIP, f"not applicable: {seen['not_applicable']}"))
            continue
        if "error" in seen:
            out.append(Check(cid, "configuration", title, FAIL, f"could not read it: {seen['error']}"))
            continue
        values = seen.get("values", {})
        wrong = {
            v: values.get(v)
            for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
            if values.get(v) != str(threads)
        }
        shown = ", ".join(f"{k}={v}" for k, v in sorted(values.items())) or "none set"
        if wrong:
            reason = "; ".join(f"{k} is {v or 'unset'}" for k, v in wrong.items())
            out.append(
                Check(cid, "configuration", title, FAIL, f"{reason}, the plan says {threads} (role thread_env)", detail=shown)
            )
        else:
            out.append(Check(cid, "configuration", title, PASS, f"{threads} threads per job, as planned", detail=shown))
    thp = cfg.get("thp", {})
    for name in ("enabled", "defrag"):
        want, have = plan.get(f"thp_{name}"), thp.get(name)
        cid = f"config.thp.{name}"
        if want is None:
            out.append(Check(cid, "configuration", f"THP {name}", INFO, f"{have}; the plan sets nothing"))
        elif have == want:
            out.append(Check(cid, "configuration", f"THP {name}", PASS, f"{have}, as planned"))
        else:
            out.append(
                Check(
                    cid,
                    "configuration",
                    f"THP {name}",
                    FAIL,
                    f"{have}, the plan says {want} (role cpu_tuning; read-only in containers)",
                )
            )
    gov = cfg.get("governor", {})
    want = plan.get("cpu_governor")
    if "not_applicable" in gov or want is None:
        out.append(
            Check(
                "config.governor",
                "configuration",
                "CPU governor",
                SKIP,
                f"not applicable: {gov.get('not_applicable', 'the plan sets none')}",
            )
        )
    else:
        st = PASS if gov.get("value") == want else FAIL
        out.append(
            Check(
                "config.governor",
                "configuration",
                "CPU governor",
                st,
                f"{gov.get('value')}" + ("" if st == PASS else f", the plan says {want}"),
            )
        )
    mount = cfg.get("data_mount", {})
    requested = raw.get("data_dir_requested")
    if "error" in mount:
        out.append(Check("config.data_mount", "configuration", "data mount", FAIL, mount["error"]))
    elif requested and raw.get("data_dir") == requested:
        noatime = "noatime" in mount.get("options", [])
        out.append(
            Check(
                "config.data_mount",
                "configuration",
                "data mount",
                PASS if noatime else WARN,
                f"{mount.get('fstype')} on {mount.get('source')} at {mount.get('target')}"
                + ("" if noatime else ", mounted without noatime (every read writes an access time)"),
                detail=",".join(mount.get("options", [])),
            )
        )
    else:
        out.append(
            Check(
                "config.data_mount",
                "configuration",
                "data mount",
                INFO,
                f"no data mount at {requested}: "
                + ("the Parquet workload ran on" if "parquet" in raw.get("results", {}) else "work files go to")
                + f" {mount.get('target')} ({mount.get('fstype')} on {mount.get('source')})",
            )
        )
    return out


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


def triad_check(raw: dict[str, Any], triad: dict[str, Any]) -> Check:
    title = "memory bandwidth (STREAM triad)"
    problem = _problem("memory.triad", "memory", title, triad)
    if problem:
        return problem
    fig = triad["gbps"]
    detail = f"{triad.get('how')}, n={triad.get('n')}, median of {len(triad.get('times_s', []))}, threads {triad.get('threads')}"
    limit, basis = dram_gbps(raw.get("memory", {}))
    if limit is None:
        return Check(
            "memory.triad", "memory", title, INFO, f"reported without a ratio: {basis}", fig, "GB/s", basis=basis, detail=detail
        )
    ratio = fig / limit
    status = grade(ratio, TRIAD_GRADES)
    reason = f"{ratio:.0%} of theoretical DRAM bandwidth (STREAM reaches 74-82%)"
    if status == WARN:
        reason += "; fewer channels populated than DIMMs, or threads below the cores"
    return Check("memory.triad", "memory", title, status, reason, fig, "GB/s", limit, basis, ratio, detail=detail)


def gbdt_checks(raw: dict[str, Any], gbdt: dict[str, Any]) -> list[Check]:
    problem = _problem("gbdt", "gradient boosting", "gradient boosting", gbdt)
    if problem:
        return [problem]
    out = []
    for lib in ("xgboost", "lightgbm", "catboost"):
        res = gbdt.get(lib) or {}
        cid, title = f"gbdt.{lib}", f"{lib} hist training"
        problem = _problem(cid, "gradient boosting", title, res)
        if problem:
            out.append(problem)
            continue
        allc, one = res["all"], res["one"]
        cores = int(raw.get("threads") or 1)
        fig = allc["row_trees_per_s"] / 1e6
        limit = one["row_trees_per_s"] * cores / 1e6
        ratio = fig / limit
        speedup = allc["row_trees_per_s"] / one["row_trees_per_s"]
        status = grade(ratio, GBDT_GRADES)
        if speedup < 1:
            status = FAIL
        reason = f"1 -> {cores} cores: {speedup:.1f}x ({ratio:.0%} of linear)"
        if status != PASS:
            reason += "; more threads barely help: oversubscription, a thread cap, or memory-bound"
        detail = (
            f"{gbdt.get('rows'):,} x {gbdt.get('cols')}, depth {gbdt.get('depth')}, {allc['trees']} trees on "
            f"{allc['threads']} threads, {one['trees']} on 1; median of {len(allc.get('times_s', []))}; "
            f"{lib} {res.get('version')}"
        )
        basis = f"the one-core rate ({one['row_trees_per_s'] / 1e6:.2f} M row-trees/s) x {cores} cores (linear scaling)"
        out.append(
            Check(cid, "gradient boosting", title, status, reason, fig, "M row-trees/s", limit, basis, ratio, detail=detail)
        )
    return out


def mlp_checks(raw: dict[str, Any], mlp: dict[str, Any]) -> list[Check]:
    title = "PyTorch MLP training step"
    problem = _problem("torch.mlp", "pytorch", title, mlp)
    if problem:
        return [problem]
    fig, limit = mlp["gflops"], mlp["sgemm_gflops"]
    ratio = fig / limit
    status = grade(ratio, MLP_GRADES)
    reasons = [f"{ratio:.0%} of torch's SGEMM rate ({mlp['samples_per_s']:,.0f} samples/s)"]
    want = raw.get("threads") if raw.get("mode") == "tuned" else None
    if want and mlp.get("threads") != want:
        status = FAIL
        reasons.append(f"torch uses {mlp.get('threads')} threads, the plan says {want}")
    if not (mlp.get("mkl") and mlp.get("mkldnn")):
        status = max(status, WARN, key=lambda s: _RANK[s])
        reasons.append(
            f"MKL {'on' if mlp.get('mkl') else 'off'}, oneDNN {'on' if mlp.get('mkldnn') else 'off'}: not a CPU build with both"
        )
    detail = (
        f"torch {mlp.get('torch')}, {mlp.get('threads')} threads, batch {mlp.get('batch')}, width {mlp.get('width')}, "
        f"median of {len(mlp.get('step_s', []))}"
    )
    basis = f"torch.mm SGEMM n={mlp.get('sgemm_n')} in the same process, same threads"
    return [Check("torch.mlp", "pytorch", title, status, "; ".join(reasons), fig, "GFLOPS", limit, basis, ratio, detail=detail)]


def hpo_checks(raw: dict[str, Any], hpo: dict[str, Any]) -> list[Check]:
    problem = _problem("hpo.parallel", "hyperparameter search", "parallel trials", hpo)
    if problem:
        return [problem]
    runs = hpo["runs"]
    detail = (
        f"{hpo['trials']} {hpo['library']} trials ({hpo['rows']:,} rows, {hpo['trees']} trees) per run, one run each, "
        f"{hpo['sampler']}" + (f"; best loss {hpo['best_loss']:.4f}" if isinstance(hpo.get("best_loss"), float) else "")
    )
    seq = runs["sequential"]["trials_per_min"]
    if "parallel" not in runs:
        return [
            Check(
                "hpo.parallel",
                "hyperparameter search",
                "parallel trials",
                SKIP,
                "one trial at a time on this host (one core): nothing to run in parallel",
                seq,
                "trials/min",
                detail=detail,
            )
        ]
    par, over = runs["parallel"], runs["oversubscribed"]
    ratio = par["trials_per_min"] / seq
    each = par["threads_each"]
    status = grade(ratio, HPO_GRADES)
    reason = f"{par['procs']} processes x {each} thread(s): {ratio:.2f}x the one-after-another rate"
    if status != PASS:
        reason += "; parallel trials lose to running them one by one: each trial's threads must be cores / trials"
    lost = [
        f"{name}: {r['trials']} of {r['trials_expected']} trials completed"
        for name, r in runs.items()
        if "trials_expected" in r and r["trials"] != r["trials_expected"]
    ]
    if "processes_seen" in par and par["processes_seen"] != par["procs"]:
        lost.append(f"the study's trials came from {par['processes_seen']} process(es), not {par['procs']}")
    if lost:
        status = FAIL
        reason = "the shared study lost work (" + "; ".join(lost) + "); " + reason
    out = [
        Check(
            "hpo.parallel",
            "hyperparameter search",
            "parallel trials",
            status,
            reason,
            par["trials_per_min"],
            "trials/min",
            seq,
            f"the same trials one after another, {runs['sequential']['threads_each']} thread(s) each",
            ratio,
            detail=detail,
        )
    ]
    oratio = over["trials_per_min"] / par["trials_per_min"]
    saved = 1 - oratio
    if raw.get("mode") != "tuned":
        ostatus, oreason = (
            INFO,
            (
                f"oversubscribed ({over['procs']} processes x {over['threads_each']} threads) runs at "
                f"{oratio:.0%} of the parallel rate with library defaults"
            ),
        )
    elif oratio <= 1.05:
        ostatus, oreason = (
            PASS,
            f"oversubscribed ({over['procs']} processes x {over['threads_each']} threads, {over.get('trials', hpo['trials'])} trials) runs at {oratio:.0%} of the planned rate: the thread plan saves {max(saved, 0):.0%}",
        )
    else:
        ostatus, oreason = WARN, f"oversubscribed ran {oratio - 1:.0%} faster than the plan's threads per trial here"
    out.append(
        Check(
            "hpo.oversubscribed",
            "hyperparameter search",
            "oversubscribed trials (every trial all threads)",
            ostatus,
            oreason,
            over["trials_per_min"],
            "trials/min",
            par["trials_per_min"],
            "the planned parallel rate",
            oratio,
            detail=detail,
        )
    )
    return out


def parquet_check(raw: dict[str, Any], pq: dict[str, Any]) -> Check:
    title = "Parquet scan from the data mount"
    problem = _problem("data.parquet", "data", title, pq)
    if problem:
        return problem
    threads = int(pq.get("scan_threads") or raw.get("threads") or 1)
    if pq.get("in_memory_gbps"):
        decode, how = pq["in_memory_gbps"], "the same file decoded from memory"
    else:
        decode, how = threads * SNAPPY_DECODE_GBPS_PER_CORE, f"snappy decode at {SNAPPY_DECODE_GBPS_PER_CORE} GB/s per thread"
    disk = pq["raw_read_gbps"]
    limit = min(disk, decode)
    bound = "the mount's sequential read" if disk <= decode else f"decoding ({threads} threads)"
    cache = "cold cache" if pq.get("cold_cache") else "warm cache: " + str(pq.get("cache_note") or "")
    basis = f"min(the same file read raw from the mount: {disk:.2f} GB/s, {how}: {decode:.2f} GB/s); bound by {bound}; {cache}"
    ratio = pq["scan_gbps"] / limit
    status = grade(ratio, PARQUET_GRADES)
    reason = f"{ratio:.0%} of {bound}"
    detail = (
        f"{pq['file_bytes'] / 1e6:.0f} MB snappy ({pq['rows']:,} rows), write {pq['write_gbps']:.2f} GB/s, "
        f"decoded {pq['decoded_gbps']:.2f} GB/s, {threads} threads, median of {len(pq.get('scan_s', []))}, "
        f"on {raw.get('data_dir')}"
    )
    return Check("data.parquet", "data", title, status, reason, pq["scan_gbps"], "GB/s", limit, basis, ratio, detail=detail)


def inference_checks(inf: dict[str, Any]) -> list[Check]:
    title = "single-row predict latency"
    problem = _problem("inference.p99", "inference", title, inf)
    if problem:
        return [problem]
    detail = (
        f"{inf['library']}, {inf['trees']} trees depth {inf['depth']}, median of {inf.get('repeats', 1)} x "
        f"{inf['calls']} calls, threads {inf['threads']}"
    )
    ok, warn = LATENCY_P99_US
    p99 = inf["p99_us"]
    status = PASS if p99 <= ok else WARN if p99 <= warn else FAIL
    basis = f"an endpoint answers in 1-20 ms: the model's p99 within {ok / 1000:.0f} ms passes, within {warn / 1000:.0f} ms warns"
    return [
        Check(
            "inference.p50",
            "inference",
            "single-row predict p50",
            INFO,
            "median latency in-process",
            inf["p50_us"],
            "µs",
            higher_is_better=False,
            detail=detail,
        ),
        Check(
            "inference.p99",
            "inference",
            "single-row predict p99",
            status,
            f"p99 {p99:,.0f} µs ({p99 / ok:.0%} of the budget)",
            p99,
            "µs",
            ok,
            basis,
            p99 / ok,
            higher_is_better=False,
            detail=detail,
        ),
    ]


# ---------------------------------------------------------------- workloads of real jobs


def sklearn_checks(raw: dict[str, Any], sk: dict[str, Any]) -> list[Check]:
    """RandomForest scaling against linear, GridSearchCV on loky workers against the same search
    run one fit after another, and the BLAS threads each worker had (over its share fails)."""
    group = "scikit-learn"
    problem = _problem("sklearn.forest", group, "RandomForest fit", sk)
    if problem:
        return [problem]
    tuned = raw.get("mode") == "tuned"
    cores = int(raw.get("threads") or 1)
    out = []
    forest = sk["forest"]
    fig, one = forest["all"]["row_trees_per_s"] / 1e6, forest["one"]["row_trees_per_s"] / 1e6
    limit = one * cores
    ratio = fig / limit
    status = grade(ratio, SKLEARN_FOREST_GRADES)
    reason = f"n_jobs {forest['all']['n_jobs']}: 1 -> {cores} cores {fig / one:.1f}x ({ratio:.0%} of linear)"
    if ratio > 1.0:
        reason += ": above the limit, so the one-core fit was measured low (a busy host?)"
    elif status != PASS:
        reason += "; the trees are independent, so n_jobs below the cores or threads fighting over them"
    out.append(
        Check(
            "sklearn.forest",
            group,
            "RandomForest fit, all cores",
            status,
            reason,
            fig,
            "M row-trees/s",
            limit,
            f"the one-core fit ({one:.3g} M row-trees/s, n_jobs=1) x {cores} cores (linear: trees are independent)",
            ratio,
            detail=f"{sk['rows']:,} x 20, {sk['trees']} trees depth 12, median of {len(forest['all']['times_s'])}; "
            f"scikit-learn {sk.get('sklearn')}",
        )
    )
    g = sk["grid"]
    workers = g["n_jobs"] if isinstance(g["n_jobs"], int) else 1
    limit = g["sequential_per_min"] * min(workers, g["candidates"] * g["folds"])
    ratio = g["parallel_per_min"] / limit
    status = grade(ratio, SKLEARN_GRID_GRADES)
    reason = (
        f"n_jobs {g['n_jobs']} ({g['n_jobs_how']}): {g['parallel_per_min'] / g['sequential_per_min']:.2f}x "
        f"the sequential search ({ratio:.0%} of linear)"
    )
    if ratio > 1.0:
        reason += ": above the limit, so the sequential search was measured low (a busy host?)"
    elif status != PASS:
        reason += "; parallel fits lose to sequential ones: each loky worker's BLAS threads must be cores / n_jobs"
    out.append(
        Check(
            "sklearn.grid",
            group,
            "GridSearchCV candidates/min",
            status,
            reason,
            g["parallel_per_min"],
            "candidates/min",
            limit,
            f"the same search with n_jobs=1 and {cores} BLAS threads ({g['sequential_per_min']:.3g}/min) x {workers} workers",
            ratio,
            detail=f"{g['estimator']}, {g['candidates']} candidates x {g['folds']} folds on {g['rows']:,} rows",
        )
    )
    seen = [w for w in g.get("workers_seen") or [] if not w.get("main")]
    title = "BLAS threads inside the loky workers"
    if not seen:
        out.append(
            Check(
                "sklearn.threads",
                group,
                title,
                INFO if not tuned else SKIP,
                "no loky worker scored: the search ran in the main process (one job)",
            )
        )
        return out
    most = max((max(w["blas"] + w["openmp"], default=0) for w in seen), default=0)
    share = g.get("share")
    shown = "; ".join(f"pid {w['pid']}: BLAS {w['blas'] or 'none'}, OpenMP {w['openmp'] or 'none'}" for w in seen)
    if not tuned or not share:
        out.append(
            Check(
                "sklearn.threads",
                group,
                title,
                INFO,
                f"at most {most} thread(s) per pool in {len(seen)} worker(s) with library defaults",
                float(most),
                "threads",
                detail=shown,
            )
        )
        return out
    over = [w for w in seen if max(w["blas"] + w["openmp"], default=0) > share]
    if over:
        status = FAIL
        reason = (
            f"oversubscribed: {len(over)} of {len(seen)} worker(s) run up to {most} BLAS/OpenMP threads, "
            f"their share is {share} ({cores} cores / {workers} workers); {workers} x {most} threads on {cores} cores"
            "; a plain search gets the share only through the ML environment's start-up hook with the environment's "
            "PROVISIONER_THREADS: run provisioner up --tags mlstack,thread_env"
        )
    else:
        status, reason = PASS, f"{len(seen)} worker(s), at most {most} thread(s) each: within the share of {share}"
    out.append(
        Check(
            "sklearn.threads",
            group,
            title,
            status,
            reason,
            float(most),
            "threads",
            float(share),
            f"{cores} cores / {workers} loky workers (threadpoolctl read inside each worker while it scored)",
            most / share,
            higher_is_better=False,
            detail=shown,
        )
    )
    return out


def features_checks(raw: dict[str, Any], fe: dict[str, Any]) -> list[Check]:
    """The same feature pipeline in Polars (held against its one-thread rate x the threads) and in pandas."""
    group = "feature engineering"
    problem = _problem("features.polars", group, "Polars feature pipeline", fe)
    if problem:
        return [problem]
    pol, one = fe["polars"], fe.get("polars_one") or {}
    fig = pol["rows_per_s"] / 1e6
    threads = int(pol.get("threads") or 1)
    detail = (
        f"{fe['rows']:,} rows in memory: {fe['pipeline']}; median of {len(pol.get('times_s', []))}; polars {pol.get('version')}"
    )
    out = []
    if "rows_per_s" in one and threads > 1:
        limit = one["rows_per_s"] * threads / 1e6
        ratio = fig / limit
        status = grade(ratio, FEATURES_GRADES)
        reason = f"1 -> {threads} threads: {pol['rows_per_s'] / one['rows_per_s']:.2f}x ({ratio:.0%} of linear)"
        if ratio > 1.0:
            reason += ": above the limit, so the one-thread run was measured low (a busy host?)"
        elif status != PASS:
            reason += "; more threads barely help: POLARS_MAX_THREADS below the cores, or other work on them"
        basis = f"Polars on one thread ({one['rows_per_s'] / 1e6:.3g} M rows/s, POLARS_MAX_THREADS=1) x {threads} threads"
        check = Check(
            "features.polars",
            group,
            "Polars feature pipeline",
            status,
            reason,
            fig,
            "M rows/s",
            limit,
            basis,
            ratio,
            detail=detail,
        )
    else:
        why = one.get("error") or one.get("skipped") or f"{threads} thread: nothing to scale"
        check = Check(
            "features.polars",
            group,
            "Polars feature pipeline",
            INFO,
            f"reported without a limit: {why}",
            fig,
            "M rows/s",
            detail=detail,
        )
    want = (raw.get("plan") or {}).get("polars_threads") or raw.get("threads")
    if raw.get("mode") == "tuned" and want and threads != int(want):
        check.status = FAIL
        check.reason = f"Polars runs {threads} threads, the plan says {want} (POLARS_MAX_THREADS); " + check.reason
    out.append(check)
    pd_ = fe.get("pandas")
    if pd_:
        same = pd_.get("result_rows") == pol.get("result_rows")
        out.append(
            Check(
                "features.pandas",
                group,
                "pandas feature pipeline (one thread)",
                INFO if same else FAIL,
                f"Polars is {pol['rows_per_s'] / pd_['rows_per_s']:.1f}x pandas on the same pipeline"
                if same
                else f"pandas kept {pd_.get('result_rows'):,} rows, Polars {pol.get('result_rows'):,}: the pipelines differ",
                pd_["rows_per_s"] / 1e6,
                "M rows/s",
                detail=f"pandas {pd_.get('version')}, median of {len(pd_.get('times_s', []))}",
            )
        )
    return out


def matrix_checks(raw: dict[str, Any], mx: dict[str, Any]) -> list[Check]:
    """The in-RAM feature matrix: held in memory without a page swapped out, and a cross-validation
    over it at the rate of the host's SGEMM."""
    group = "feature matrix"
    problem = _problem("matrix.cv", group, "cross-validation over the feature matrix", mx)
    if problem:
        return [problem]
    out = []
    gb = mx["bytes"] / 1e9
    planned_bytes = mx.get("planned_bytes") or (mx["planned_rows"] * mx["features"] * 4 if mx.get("planned_rows") else None)
    limit = planned_bytes / 1e9 if planned_bytes else None
    swapped = int(mx.get("swapped_out_pages") or 0)
    r2 = mx.get("r2")
    if swapped:
        status, reason = FAIL, f"{swapped:,} pages swapped out while the matrix was held: it does not fit beside the rest"
    elif r2 is None or r2 < 0.5:
        status, reason = FAIL, f"the cross-validation's R² is {r2}: the folds were not computed over the matrix built"
    else:
        status, reason = PASS, f"{mx['rows']:,} x {mx['features']} float32 held and cross-validated, no page swapped out"
    if not limit:
        basis = ""
    elif mx.get("planned_from_plan", True):
        basis = f"the plan's largest matrix this host holds without swapping ({number(limit)} GB)"
    else:
        basis = f"the largest matrix by the workload's own rule ({number(limit)} GB): the plan has no feature_matrix_rows"
    out.append(
        Check(
            "matrix.memory",
            group,
            "feature matrix held in RAM",
            status,
            reason,
            gb,
            "GB",
            limit,
            basis,
            gb / limit if limit else None,
            detail=f"{mx['rows_how']}; built at {mx['build_gbps']:.2f} GB/s; peak RSS {mx['max_rss_bytes'] / 1e9:.2f} GB",
        )
    )
    ratio = mx["cv_gflops"] / mx["sgemm_gflops"]
    status = grade(ratio, MATRIX_GRADES)
    reason = f"{ratio:.0%} of the SGEMM rate, {mx['folds']} folds in {mx['cv_s']:.2f} s (R² {r2 if r2 is None else round(r2, 3)})"
    if ratio > 1.0:
        reason += ": above the limit, so the SGEMM rate was measured low (a busy host?)"
    elif status != PASS:
        reason += "; the Gram matrices are GEMMs: check the BLAS kernel and the thread count"
    out.append(
        Check(
            "matrix.cv",
            group,
            "cross-validation over the feature matrix",
            status,
            reason,
            mx["cv_gflops"],
            "GFLOPS",
            mx["sgemm_gflops"],
            "numpy SGEMM n=2048 in the same process, same threads",
            ratio,
            detail=f"{mx['how']}; threads {mx['threads']}",
        )
    )
    return out


def dataloader_checks(raw: dict[str, Any], dl: dict[str, Any]) -> list[Check]:
    """A DataLoader over Parquet shards feeding a small network: samples/s against the same training
    on batches already in memory, the share of the loop spent waiting for data, and num_workers=0."""
    group = "data loading"
    problem = _problem("dataloader.samples", group, "DataLoader feeding training", dl)
    if problem:
        return [problem]
    planned, limit_run, zero = dl["planned"], dl["in_memory"], dl["workers0"]
    fig, limit = planned["samples_per_s"], limit_run["samples_per_s"]
    ratio = fig / limit
    status = grade(ratio, LOADER_GRADES)
    setup = f"{dl['workers']} worker(s) ({dl['workers_how']}) + {dl['threads']} training thread(s) ({dl['threads_how']})"
    reason = f"{setup}: {ratio:.0%} of the in-memory rate, {fig / zero['samples_per_s']:.2f}x num_workers=0"
    if ratio > 1.05:
        reason += ": above the limit, so the in-memory run was measured low (a busy host?)"
    elif status != PASS:
        reason += "; the loop waits for data: more loader workers, or fewer training threads beside them"
    detail = (
        f"{dl['rows']:,} rows x {dl['features']} in {dl['shards']} snappy shards ({dl['shard_bytes'] / 1e6:.0f} MB) "
        f"on {dl['where']}, batch {dl['batch']}, {dl['epochs']} epoch(s), {dl['network']}; torch {dl['torch']}"
    )
    out = [
        Check(
            "dataloader.samples",
            group,
            "DataLoader feeding training",
            status,
            reason,
            fig,
            "samples/s",
            limit,
            f"the same training on the batches already in memory ({limit:,.0f} samples/s, "
            f"{dl['threads']} thread(s)): the loop never waits",
            ratio,
            detail=detail,
        )
    ]
    wait = planned["wait_share"] * 100
    ok, warn = LOADER_WAIT_PCT
    status = PASS if wait <= ok else WARN if wait <= warn else FAIL
    out.append(
        Check(
            "dataloader.wait",
            group,
            "training loop waiting for data",
            status,
            f"{wait:.0f}% of the loop in next(batch) with {dl['workers']} worker(s); "
            f"{zero['wait_share'] * 100:.0f}% with num_workers=0",
            wait,
            "% of the loop",
            ok,
            f"within {ok:.0f}% passes, within {warn:.0f}% warns",
            wait / ok,
            higher_is_better=False,
            detail=setup,
        )
    )
    out.append(
        Check(
            "dataloader.workers0",
            group,
            "DataLoader with num_workers=0",
            INFO,
            f"decoding in the training process, {zero.get('threads')} thread(s): "
            f"{zero['wait_share'] * 100:.0f}% of the loop waiting",
            zero["samples_per_s"],
            "samples/s",
        )
    )
    return out


def tensorflow_checks(raw: dict[str, Any], tf: dict[str, Any]) -> list[Check]:
    """A Keras training step against TensorFlow's own SGEMM rate, with oneDNN in use as TensorFlow says."""
    title = "TensorFlow Keras training step"
    problem = _problem("tensorflow.step", "tensorflow", title, tf)
    if problem:
        return [problem]
    fig, limit = tf["gflops"], tf["sgemm_gflops"]
    ratio = fig / limit
    status = grade(ratio, MLP_GRADES)
    reasons = [f"{ratio:.0%} of TensorFlow's SGEMM rate ({tf['samples_per_s']:,.0f} samples/s)"]
    if tf.get("onednn") is False:
        status = FAIL if raw.get("mode") == "tuned" else max(status, WARN, key=lambda s: _RANK[s])
        reasons.append("oneDNN is off (TF_ENABLE_ONEDNN_OPTS=1, role thread_env)")
    elif tf.get("onednn") is None:
        status = max(status, WARN, key=lambda s: _RANK[s])
        reasons.append(f"oneDNN unknown: {tf.get('onednn_how')}")
    else:
        reasons.append("oneDNN on")
    detail = (
        f"tensorflow {tf.get('tensorflow')}, intra-op {tf.get('intra_op_threads')}, inter-op {tf.get('inter_op_threads')} "
        f"({tf.get('threads_how')}), batch {tf.get('batch')}, width {tf.get('width')}, oneDNN: {tf.get('onednn_how')}"
    )
    return [
        Check(
            "tensorflow.step",
            "tensorflow",
            title,
            status,
            "; ".join(reasons),
            fig,
            "GFLOPS",
            limit,
            f"tf.matmul SGEMM n={tf.get('sgemm_n')} in the same process, same threads",
            ratio,
            detail=detail,
        )
    ]


def cluster_checks(cl: dict[str, Any]) -> list[Check]:
    """The hpo workload's study on the Ray cluster (provisioner smoke --cluster): trials/min on
    every node against the same trials on the head alone. A correctness figure: every trial ran,
    every node ran some, each with the threads its reservation gives; lab servers that share one
    machine's cores are not expected to be faster together (docs/ray.md)."""
    problem = _problem("cluster.trials", "distributed trials", "trials on the Ray cluster", cl)
    if problem:
        return [problem]
    runs = cl["runs"]
    cluster, head = runs["cluster"], runs["head"]
    per_trial = cl["trial_cpus"]
    nodes = [n["name"] for n in cl["nodes"]]
    detail = (
        f"{cl['trials']} {cl['library']} trials ({cl['rows']:,} rows, {cl['trees']} trees) per run, {per_trial} CPU each, "
        f"{cl['sampler']}; Ray {cl['ray']}, Optuna {cl['optuna']}; nodes: "
        + ", ".join(f"{n['name']} ({number(n['cpus'])} CPUs)" for n in cl["nodes"])
    )
    problems = [
        f"{name}: {r['trials']} of {r['trials_expected']} trials completed" + (f" ({r['errors'][0]})" if r.get("errors") else "")
        for name, r in (("cluster", cluster), ("head alone", head))
        if r["trials"] != r["trials_expected"]
    ]
    missing = sorted(set(cl.get("members") or nodes) - set(nodes))
    if missing:
        problems.append(f"member(s) {', '.join(missing)} not in the cluster")
    idle = sorted(n for n in nodes if not cluster["per_node"].get(n))
    if idle:
        problems.append(f"node(s) {', '.join(idle)} ran no trial")
    wrong = [t for t in cluster["threads_seen"] + head["threads_seen"] if t != per_trial]
    if wrong:
        problems.append(f"trials ran {sorted(set(wrong))} OpenMP threads, not the {per_trial} their reservation gives")
    ratio = cluster["trials_per_min"] / head["trials_per_min"] if cluster["trials_per_min"] and head["trials_per_min"] else None
    spread = ", ".join(f"{n} {c}" for n, c in sorted(cluster["per_node"].items()))
    if problems:
        status, reason = FAIL, "the distributed study lost work: " + "; ".join(problems)
    else:
        status = PASS
        reason = f"every trial ran, on every node ({spread}), {per_trial} thread(s) each" + (
            f"; {ratio:.2f}x the head alone" if ratio else ""
        )
    return [
        Check(
            "cluster.trials",
            "distributed trials",
            "trials on the Ray cluster",
            status,
            reason,
            cluster["trials_per_min"],
            "trials/min",
            head["trials_per_min"],
            "the same trials on the head alone (a correctness figure where the nodes share cores)",
            ratio,
            detail=detail,
        )
    ]


def serving_level(serving: dict[str, Any], connections: int = SERVING_CONNECTIONS) -> dict[str, Any] | None:
    """The wrk figures of the model server at `connections` concurrent connections, if measured."""
    return next((lv for lv in serving.get("levels") or [] if lv.get("connections") == connections), None)


def serving_curve(serving: dict[str, Any]) -> list[dict[str, Any]]:
    """Latency against load: one point per connection level, fewest connections first."""
    points = [
        {k: lv.get(k) for k in ("connections", "requests_per_s", "p50_ms", "p99_ms")}
        for lv in serving.get("levels") or []
        if lv.get("p50_ms") is not None and lv.get("p99_ms") is not None
    ]
    return sorted(points, key=lambda p: p["connections"])


def _failed_requests(serving: dict[str, Any]) -> list[str]:
    """Per level with any, its socket errors and non-2xx responses, as people read them."""
    out = []
    for lv in serving.get("levels") or []:
        errors, non2xx = int(lv.get("socket_errors") or 0), int(lv.get("non_2xx") or 0)
        if errors or non2xx:
            out.append(f"{lv.get('connections')} connections: {errors:,} socket errors, {non2xx:,} non-2xx")
    return out


def serving_checks(raw: dict[str, Any], serving: dict[str, Any]) -> list[Check]:
    """The model server under wrk: requests/s and p99 at 8 connections, failed requests at every level,
    the other levels and the in-process rate reported."""
    title = "model server requests/s"
    problem = _problem("serving.rps", "serving", title, serving)
    if problem:
        return [problem]
    level = serving_level(serving)
    if level is None or level.get("requests_per_s") is None:
        return [Check("serving.rps", "serving", title, FAIL, f"no figures at {SERVING_CONNECTIONS} connections")]
    model = serving.get("model") or {}
    target = serving.get("target", "throwaway")
    what = (
        f"{target} server, {serving.get('workers_how')}; "
        f"{serving.get('model_name') or 'smoke/1'} {model.get('framework', '')} "
        + (f"{model.get('trees')} trees depth {model.get('depth')}, " if model.get("trees") else "")
        + f"{model.get('features')} features"
    )
    runs = len(level.get("runs") or [1])
    detail = f"{what}; wrk -t1, {level.get('seconds')} s x {runs} per level, one JSON row per POST"
    short = f"{target} server, wrk at {SERVING_CONNECTIONS} connections"
    failed = _failed_requests(serving)
    cores = int(raw.get("cpu", {}).get("physical_cores") or 1)
    inproc = (serving.get("inproc") or {}).get("per_s")
    rps = float(level["requests_per_s"])
    p50 = level.get("p50_ms")
    out = []
    if inproc:
        limit = inproc * cores
        ratio = rps / limit
        status = grade(ratio, SERVING_GRADES)
        reason = (
            f"{ratio:.0%} of the in-process rate x {cores} cores (the HTTP layer and the load generator on the same "
            f"cores take the rest); p50 {p50:.2f} ms"
        )
        if ratio > 1.0:
            reason += ": above the limit, so the in-process rate was measured low (a busy host?)"
        elif status != PASS:
            reason += "; too few workers, threads fighting over the cores, or a worker off its CPU slice"
        basis = (
            f"the in-process predict rate through the server's loader and predict path ({inproc:,.0f}/s, one thread) "
            f"x {cores} physical cores"
        )
        rps_check = Check("serving.rps", "serving", title, status, reason, rps, "requests/s", limit, basis, ratio, detail=detail)
    else:
        why = serving.get("inproc_error") or "the in-process rate was not measured"
        rps_check = Check(
            "serving.rps", "serving", title, INFO, f"reported without a limit: {why}", rps, "requests/s", detail=detail
        )
    if failed:
        rps_check.status = FAIL
        rps_check.reason = f"failed requests under load ({'; '.join(failed)}); " + rps_check.reason
    out.append(rps_check)
    ok, warn = SERVING_P99_MS
    p99 = level.get("p99_ms")
    if p99 is not None:
        status = PASS if p99 <= ok else WARN if p99 <= warn else FAIL
        out.append(
            Check(
                "serving.p99",
                "serving",
                f"model server p99 at {SERVING_CONNECTIONS} connections",
                status,
                f"p99 {p99:.2f} ms ({p99 / ok:.0%} of the budget)"
                + ("" if status == PASS else "; requests queue behind busy workers: more workers, or fewer threads each"),
                p99,
                "ms",
                ok,
                f"an endpoint answers in 1-20 ms: p99 within {ok:.0f} ms passes, within {warn:.0f} ms warns",
                p99 / ok,
                higher_is_better=False,
                detail=short,
            )
        )
    total = sum(int(lv.get("requests") or 0) for lv in serving.get("levels") or [])
    bad = sum(int(lv.get("socket_errors") or 0) + int(lv.get("non_2xx") or 0) for lv in serving.get("levels") or [])
    out.append(
        Check(
            "serving.errors",
            "serving",
            "model server failed requests",
            FAIL if failed else PASS,
            "; ".join(failed)
            if failed
            else f"none of {total:,} requests at {', '.join(str(lv.get('connections')) for lv in serving.get('levels') or [])} connections",
            float(bad),
            "requests",
            basis="every request at every level answered 2xx",
            higher_is_better=False,
            detail=f"{target} server, wrk socket errors and non-2xx responses",
        )
    )
    for lv in serving.get("levels") or []:
        c = lv.get("connections")
        if c == SERVING_CONNECTIONS or lv.get("requests_per_s") is None:
            continue
        out.append(
            Check(
                f"serving.rps_c{c}",
                "serving",
                f"model server requests/s at {c} connection{'s' if c != 1 else ''}",
                INFO,
                f"p50 {lv.get('p50_ms') or 0:.2f} ms, p99 {lv.get('p99_ms') or 0:.2f} ms",
                float(lv["requests_per_s"]),
                "requests/s",
                detail=f"{target} server, wrk at {c} connection{'s' if c != 1 else ''}",
            )
        )
    if inproc:
        ip = serving["inproc"]
        out.append(
            Check(
                "serving.inproc",
                "serving",
                "in-process predict rate (one thread)",
                INFO,
                f"p50 {ip.get('p50_us', 0):,.0f} µs, p99 {ip.get('p99_us', 0):,.0f} µs per row",
                float(inproc),
                "predicts/s",
                detail=f"{ip.get('how')}; median of {ip.get('repeats')} x {ip.get('calls')} calls",
            )
        )
    return out


# ---------------------------------------------------------------- cost


def hourly_price(price_per_month: float) -> float:
    """A monthly price per hour: a month is HOURS_PER_MONTH (730) hours."""
    return price_per_month / HOURS_PER_MONTH


def cost_per_million(requests_per_s: float, price_per_hour: float) -> float:
    """$ per million predictions: the hours a million requests take at this rate, times the hourly price."""
    return 1e6 / requests_per_s * price_per_hour / 3600


def cost_per_trial(trials_per_min: float, price_per_hour: float) -> float:
    """$ per trial: an hour's price over the trials an hour holds."""
    return price_per_hour / (trials_per_min * 60)


def cost_checks(cost: dict[str, Any], checks: list[Check]) -> list[Check]:
    """With the host's monthly price: its measured serving and trial throughput in dollars, and the
    same throughput at each cloud instance's on-demand price (an instance of the class doing what
    this host did). Nothing without a price."""
    price = cost.get("price_per_month")
    if not price or price <= 0:
        return []
    hourly = hourly_price(float(price))
    clouds = {str(k): float(v) for k, v in (cost.get("cloud_prices") or {}).items() if v and float(v) > 0}
    by = {c.id: c for c in checks}
    out = []
    for key, source, unit, fn, what in (
        ("serving", "serving.rps", "$/1M predictions", cost_per_million, "requests/s"),
        ("hpo", "hpo.parallel", "$/trial", cost_per_trial, "trials/min"),
    ):
        src = by.get(source)
        if src is None or not src.figure:
            continue
        if key == "serving" and by.get("serving.errors") and by["serving.errors"].status == FAIL:
            continue  # failed requests are no predictions
        here = fn(src.figure, hourly)
        basis = f"{number(src.figure)} {what} measured ({src.title}) at ${price:,.2f} a month = ${hourly:.4f}/h ({HOURS_PER_MONTH:.0f} h)"
        title = "$ per 1M predictions" if key == "serving" else "$ per trial"
        out.append(Check(f"cost.{key}.host", "cost", f"{title}, this host", INFO, basis, here, unit, higher_is_better=False))
        for name, per_hour in clouds.items():
            there = fn(src.figure, per_hour)
            out.append(
                Check(
                    f"cost.{key}.{name}",
                    "cost",
                    f"{title}, {name}",
                    INFO,
                    f"the same {number(src.figure)} {what} at ${per_hour:.3f}/h on demand: {there / here:.2f}x this host's cost",
                    there,
                    unit,
                    higher_is_better=False,
                )
            )
    return out


# ---------------------------------------------------------------- before/after, regressions


def _better_ratio(check: Check, other: float) -> float | None:
    if not check.figure or not other:
        return None
    return check.figure / other if check.higher_is_better else other / check.figure


def attach_baseline(report: HostReport, baseline: HostReport | None) -> None:
    """Put the unprovisioned machine's figure next to each figure (gain = after / before)."""
    if baseline is None:
        return
    report.baseline_started = baseline.started
    before = {c.id: c.figure for c in baseline.checks if c.figure is not None}
    after = {c.id: c.figure for c in report.checks if c.figure is not None}
    for c in report.checks:
        source = next((src for prefix, src in COST_SOURCES.items() if c.id.startswith(prefix)), None)
        if source and c.figure and before.get(source) and after.get(source):
            # What the baseline's throughput cost at this run's price (the baseline may have had none).
            c.baseline = c.figure * after[source] / before[source]
            c.gain = _better_ratio(c, c.baseline)
        elif c.id in before and c.id not in ILLUSTRATIONS:
            c.baseline = before[c.id]
            c.gain = _better_ratio(c, before[c.id])
    if "baseline" in baseline.curves:
        report.curves["baseline"] = baseline.curves["baseline"]


def flag_regressions(report: HostReport, previous: HostReport | None, threshold: float = REGRESSION) -> None:
    """Flag figures more than `threshold` worse than the host's last run of the same mode and profile."""
    if previous is None:
        return
    report.previous_started = previous.started
    last = {c.id: c.figure for c in previous.checks if c.figure is not None}
    for c in report.checks:
        # A cost follows its throughput (judged already) and the price the user gave.
        if c.id not in last or c.figure is None or c.id in ILLUSTRATIONS or c.group == "cost":
            continue
        c.previous = last[c.id]
        change = _better_ratio(c, last[c.id])
        # Within this run's own spread, the last figure is noise, not a change.
        noise = c.spread is not None and c.spread[0] <= last[c.id] <= c.spread[1]
        if change is not None and change < 1 - threshold and not noise:
            c.regression = True
            if _RANK[c.status] < _RANK[WARN]:
                c.status = WARN
            c.reason += f"; regression: {1 - change:.0%} worse than the last run ({previous.started}: {last[c.id]:,.3g} {c.unit})"


# ---------------------------------------------------------------- history per host


def history_dir(host: str) -> Path:
    return paths.state_dir() / "smoke" / host


def save(report: HostReport) -> Path:
    d = history_dir(report.host)
    d.mkdir(parents=True, exist_ok=True)
    stamp = report.started.replace(":", "").replace("-", "") or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = d / f"{stamp}-{report.mode}-{report.profile}.json"
    path.write_text(json.dumps(report.to_dict(raw=True), indent=1))
    return path


def latest(host: str, mode: str, profile: str | None = None) -> HostReport | None:
    """The host's last kept run of this mode and profile (None: any profile)."""
    files = sorted(history_dir(host).glob(f"*-{mode}-{profile or '*'}.json"))
    return HostReport.from_dict(json.loads(files[-1].read_text())) if files else None


def judge(host: str, raw: dict[str, Any], keep: bool = True) -> HostReport:
    """Evaluate a host's raw figures against its limits, its baseline and its last run; keep it."""
    report = evaluate(raw)
    report.host = host
    if report.mode == "tuned":  # the baseline of the same profile, else of any
        attach_baseline(report, latest(host, "baseline", report.profile) or latest(host, "baseline"))
    flag_regressions(report, latest(host, report.mode, report.profile))
    if keep:
        save(report)
    return report


# ---------------------------------------------------------------- a run's outcome


@dataclass
class SmokeRun:
    """The playbook run that measured, and each measured host's judged report."""

    run: RunResult
    reports: list[HostReport]
    html: Path | None = None

    @property
    def exit_code(self) -> ExitCode:
        """The run's failure, else 1 when a tuned host failed a check (a baseline records, never fails)."""
        if self.run.exit_code != ExitCode.OK:
            return self.run.exit_code
        failed = any(r.status == FAIL and r.mode == "tuned" for r in self.reports)
        return ExitCode.HOST_FAILED if failed else ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_code": int(self.exit_code),
            "run": self.run.to_dict(),
            "html": str(self.html) if self.html else None,
            "hosts": {r.host: r.to_dict() for r in self.reports},
        }


def default_html() -> Path:
    return paths.state_dir() / "smoke" / "report.html"
