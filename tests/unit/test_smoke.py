"""The smoke test's judgement: peak derivation, thresholds, before/after, regressions, report."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
import sysfs_cases

from provisioner import report, smoke
from provisioner.smoke.workloads import serving

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def raw():
    """Figures measured on a 2-core AMD EPYC (Zen 5) VM in baseline mode."""
    return json.loads((DATA / "smoke_raw_baseline.json").read_text())


@pytest.fixture
def tuned(raw):
    """The same machine as a provisioned host would report it (tuned mode, plan and configuration)."""
    t = copy.deepcopy(raw)
    t["mode"] = "tuned"
    t["plan"] = {"threads_per_job": 2, "trials": 2, "threads_per_trial": 1, "thp_enabled": "madvise",
                 "thp_defrag": "madvise", "cpu_governor": None, "blas": "openblas"}
    t["data_dir_requested"] = "/data"
    env = {"OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    t["config"].update({"login_shell": {"values": dict(env)}, "systemd_service": {"values": dict(env)}})
    return t


def slower(gemm: dict, factor: float) -> None:
    """A GEMM result `factor` as fast: its median and every repeat."""
    gemm["gflops"] *= factor
    gemm["times_s"] = [t / factor for t in gemm["times_s"]]


def by_id(rep: smoke.HostReport) -> dict[str, smoke.Check]:
    return {c.id: c for c in rep.checks}


@pytest.mark.parametrize(
    ("vendor", "family", "model", "flags", "expected"),
    [
        ("AuthenticAMD", 0x1A, 2, ["avx2", "fma", "avx512f"], 32),  # Zen 5
        ("AuthenticAMD", 0x19, 0x61, ["avx2", "fma", "avx512f"], 16),  # Zen 4: double-pumped
        ("AuthenticAMD", 0x19, 0x21, ["avx2", "fma"], 16),  # Zen 3
        ("AuthenticAMD", 0x17, 0x31, ["avx2", "fma"], 16),  # Zen 2
        ("AuthenticAMD", 0x17, 0x01, ["avx2", "fma"], 8),  # Zen 1: 128-bit pipes
        ("GenuineIntel", 6, 0x8F, ["avx2", "fma", "avx512f"], 32),  # Sapphire Rapids
        ("GenuineIntel", 6, 0x3F, ["avx", "avx2", "fma"], 16),  # Haswell
        ("GenuineIntel", 6, 0x2A, ["avx"], 8),  # Sandy Bridge
        ("GenuineIntel", 6, 0x1A, ["sse2"], 4),
    ],
)
def test_fp64_flops_per_cycle_follows_the_microarchitecture(vendor, family, model, flags, expected):
    value, why = smoke.fp64_flops_per_cycle(vendor, family, model, flags)
    assert value == expected
    assert why


def test_peak_is_cores_times_flops_per_cycle_times_the_clock_and_says_which_clock(raw):
    checks = by_id(smoke.evaluate(raw))
    d = checks["compute.dgemm_all"]
    assert d.limit == pytest.approx(2 * 32 * 2.596122, rel=1e-4)  # 2 cores, Zen 5, cpu MHz under load
    assert "2.60 GHz" in d.basis and "no cpufreq driver" in smoke.evaluate(raw).hardware["clock_basis"]
    s = checks["compute.sgemm_one"]
    assert s.limit == pytest.approx(1 * 64 * 2.596122, rel=1e-4)  # FP32: twice the FP64 rate, one core
    assert "above the peak" in s.reason  # 233 GFLOPS on one core: the clock runs above the nominal one


def test_a_wrong_blas_kernel_fails_the_gemm_check(raw):
    # OPENBLAS_CORETYPE=Prescott gives about a fifth of DGEMM: far below the peak.
    raw["results"]["gemm"]["dgemm_one"]["gflops"] = 18.0
    raw["results"]["gemm"]["blas"][0]["architecture"] = "Prescott"
    c = by_id(smoke.evaluate(raw))["compute.dgemm_one"]
    assert c.status == smoke.FAIL
    assert "Prescott" in c.reason
    raw["results"]["gemm"]["dgemm_one"]["gflops"] = 40.0  # Haswell kernel on AVX-512: about half
    assert by_id(smoke.evaluate(raw))["compute.dgemm_one"].status == smoke.WARN


def test_the_doctors_kernel_verdict_fails_gemm_whatever_the_ratio(raw):
    # An SSE kernel on a Zen 4 core can still reach about half of its peak: by ratio alone a
    # warning; the doctor (the ML environment's kernel table) says the kernel is wrong.
    raw["results"]["gemm"]["dgemm_one"]["gflops"] = 45.0
    raw["results"]["gemm"]["blas"][0]["architecture"] = "Katmai"
    assert by_id(smoke.evaluate(raw))["compute.dgemm_one"].status == smoke.WARN
    raw["results"]["gemm"]["kernel_check"] = {
        "name": "blas-kernel",
        "status": "fail",
        "detail": "numpy: openblas 0.3.30 runs the Katmai kernel on this AVX-512 CPU (expected cooperlake/sapphirerapids/skylakex)",
    }
    checks = by_id(smoke.evaluate(raw))
    for key in ("dgemm_one", "dgemm_all", "sgemm_one", "sgemm_all"):
        assert checks[f"compute.{key}"].status == smoke.FAIL, key
        assert "Katmai kernel on this AVX-512 CPU" in checks[f"compute.{key}"].reason
    raw["results"]["gemm"]["kernel_check"] = {"name": "blas-kernel", "status": "pass", "detail": "AVX-512 CPU: ..."}
    assert by_id(smoke.evaluate(raw))["compute.dgemm_one"].status == smoke.WARN


def test_the_clock_measured_under_load_wins_over_nominal_ones(raw):
    raw["cpu"]["max_mhz"] = 5000.0
    assert smoke.clock_ghz(raw)[0] == pytest.approx(2.596122)
    del raw["results"]["gemm"]["clock_mhz_under_load"]
    ghz, why = smoke.clock_ghz(raw)
    assert ghz == 5.0 and "cpuinfo_max_freq" in why


def counted(raw, one_mhz=3650.0, all_mhz=3600.0):
    """The clock the smoke script counts in cycles right after the DGEMM runs (hosts without cpufreq)."""
    raw["results"]["gemm"]["clock_loop"] = {
        "method": "a chain of dependent `add rax, rdx` (1 cycle each)",
        "adds_per_iteration": 64,
        "one": {"cpu": 0, "mhz": one_mhz, "repeats_mhz": [one_mhz], "on_cpu": 1.0},
        "all": {"cpus": [0, 1], "mhz": all_mhz, "per_core_mhz": [all_mhz, all_mhz], "on_cpu": [1.0, 1.0]},
    }
    return raw


def test_the_clock_order_is_cpufreq_under_load_then_counted_then_nominal(raw):
    assert raw["cpu"]["cpufreq"] is False  # the fixture's VM: the figure "under load" is /proc/cpuinfo's nominal
    counted(raw)
    ghz, why = smoke.clock_ghz(raw, "one")
    assert ghz == pytest.approx(3.65) and "counted" in why and "one core alone" in why
    ghz, why = smoke.clock_ghz(raw)
    assert ghz == pytest.approx(3.6) and "each of 2 core(s) at once" in why
    # A cpufreq driver's clock under DGEMM load stays first, for both peaks.
    raw["cpu"]["cpufreq"] = True
    raw["results"]["gemm"]["clock_source"] = "cpufreq scaling_cur_freq under DGEMM load"
    assert smoke.clock_ghz(raw, "one") == (pytest.approx(2.596122), "cpufreq scaling_cur_freq under DGEMM load")
    assert smoke.clock_ghz(raw, "all")[0] == pytest.approx(2.596122)
    # No count (another architecture, an executable mapping refused): the nominal clock, and why.
    raw["cpu"]["cpufreq"] = False
    raw["results"]["gemm"]["clock_loop"] = {"unavailable": "an executable memory mapping is refused (Permission denied)"}
    ghz, why = smoke.clock_ghz(raw, "one")
    assert ghz == pytest.approx(2.596122) and "could not be counted: an executable memory mapping is refused" in why
    del raw["results"]["gemm"]["clock_mhz_under_load"]
    ghz, why = smoke.clock_ghz(raw, "all")
    assert ghz == pytest.approx(2.596122) and "nominal" in why and "could not be counted" in why


def test_one_core_and_all_core_peaks_use_their_own_counted_clock(raw):
    checks = by_id(smoke.evaluate(counted(raw)))
    assert checks["compute.dgemm_one"].limit == pytest.approx(1 * 32 * 3.65)
    assert checks["compute.sgemm_one"].limit == pytest.approx(1 * 64 * 3.65)
    assert checks["compute.dgemm_all"].limit == pytest.approx(2 * 32 * 3.60)
    assert "3.65 GHz (counted on one core" in checks["compute.dgemm_one"].basis
    assert "3.60 GHz (counted on all cores" in checks["compute.dgemm_all"].basis
    hw = smoke.evaluate(raw).hardware
    assert hw["clock_ghz"] == 3.6 and hw["clock_one_ghz"] == 3.65 and "one core: 3.65 GHz" in hw["clock_basis"]
    # Above the counted clock's peak the clock is not what is wrong: the FLOPs/cycle are.
    raw["results"]["gemm"]["sgemm_one"]["gflops"] = 1.2 * 64 * 3.65
    assert "FLOPs/cycle assumed" in by_id(smoke.evaluate(raw))["compute.sgemm_one"].reason


def test_a_result_file_from_before_the_counted_clock_judges_as_before(raw):
    """The fixture has no clock_loop: every GEMM check keeps the nominal clock's peak and grade."""
    checks = by_id(smoke.evaluate(raw))
    for key, cores, per_cycle in (("dgemm_all", 2, 32), ("dgemm_one", 1, 32), ("sgemm_all", 2, 64), ("sgemm_one", 1, 64)):
        c = checks[f"compute.{key}"]
        fig = raw["results"]["gemm"][key]["gflops"]
        assert c.limit == pytest.approx(cores * per_cycle * 2.596122)
        assert c.status == smoke.grade(fig / c.limit, smoke.GEMM_GRADES)
    assert smoke.evaluate(raw).hardware["clock_one_ghz"] == pytest.approx(2.596)
    # Older still: no cpufreq field at all, the clock under load is taken as it was.
    del raw["cpu"]["cpufreq"]
    assert smoke.clock_ghz(raw, "one")[0] == pytest.approx(2.596122)


def test_dram_limit_comes_from_the_dimms_or_there_is_no_ratio(raw):
    c = by_id(smoke.evaluate(raw))["memory.triad"]
    assert c.status == smoke.INFO and c.ratio is None and "dmidecode is not installed" in c.reason
    raw["memory"] = {"source": "dmidecode -t 17", "dimms": [
        {"size": "32 GB", "type": "DDR5", "configured_mts": 3600, "rated_mts": 4800, "locator": "A1"},
        {"size": "32 GB", "type": "DDR5", "configured_mts": 3600, "rated_mts": 4800, "locator": "B1"},
    ]}
    c = by_id(smoke.evaluate(raw))["memory.triad"]
    assert c.limit == pytest.approx(57.6)  # AM5: 2 channels x 8 B x 3600 MT/s
    assert c.figure is not None
    assert "configured" in c.basis and c.ratio == pytest.approx(c.figure / 57.6)
    raw["memory"]["dimms"][0]["configured_mts"] = None
    raw["memory"]["dimms"][0]["rated_mts"] = None
    assert smoke.dram_gbps(raw["memory"])[0] is None


def test_gbdt_scaling_is_held_against_linear_and_slower_with_more_threads_fails(raw):
    checks = by_id(smoke.evaluate(raw))
    x = checks["gbdt.xgboost"]
    one = raw["results"]["gbdt"]["xgboost"]["one"]["row_trees_per_s"]
    assert x.limit == pytest.approx(one * 2 / 1e6)
    raw["results"]["gbdt"]["lightgbm"]["all"]["row_trees_per_s"] = one * 0.8
    raw["results"]["gbdt"]["lightgbm"]["one"]["row_trees_per_s"] = one
    assert by_id(smoke.evaluate(raw))["gbdt.lightgbm"].status == smoke.FAIL


def test_parallel_trials_against_one_after_another(raw, tuned):
    # Baseline: library defaults in every trial process (oversubscribed): slower than sequential.
    assert by_id(smoke.evaluate(raw))["hpo.parallel"].status == smoke.FAIL
    runs = tuned["results"]["hpo"]["runs"]
    runs["parallel"].update(seconds=2.0, trials_per_min=60.0, threads_each=1)
    checks = by_id(smoke.evaluate(tuned))
    assert checks["hpo.parallel"].status == smoke.PASS
    assert checks["hpo.parallel"].ratio == pytest.approx(60.0 / runs["sequential"]["trials_per_min"])
    over = checks["hpo.oversubscribed"]
    assert over.status == smoke.PASS and "saves" in over.reason


def test_missing_libraries_and_failed_workloads_are_named(raw):
    raw["results"]["mlp"] = {"skipped": "torch is not installed in this environment (component torch)"}
    raw["results"]["inference"] = {"error": "inference: ValueError: boom"}
    del raw["results"]["parquet"]
    checks = by_id(smoke.evaluate(raw))
    assert checks["torch.mlp"].status == smoke.SKIP and "component torch" in checks["torch.mlp"].reason
    assert checks["inference.p99"].status == smoke.FAIL and "boom" in checks["inference.p99"].reason
    assert "data.parquet" not in checks


def test_latency_thresholds(raw):
    inf = raw["results"]["inference"]
    for p99, status in ((800.0, smoke.PASS), (4000.0, smoke.WARN), (25000.0, smoke.FAIL)):
        inf["p99_us"] = p99
        assert by_id(smoke.evaluate(raw))["inference.p99"].status == status


def test_configuration_as_the_workloads_see_it(tuned):
    checks = by_id(smoke.evaluate(tuned))
    assert checks["config.threads.login_shell"].status == smoke.PASS
    assert checks["config.governor"].status == smoke.SKIP and "no cpufreq" in checks["config.governor"].reason
    assert checks["config.data_mount"].status == smoke.INFO and "no data mount at /data" in checks["config.data_mount"].reason
    tuned["config"]["login_shell"]["values"].pop("OPENBLAS_NUM_THREADS")
    tuned["config"]["systemd_service"] = {"not_applicable": "systemd is not running here"}
    tuned["config"]["thp"]["enabled"] = "always"
    tuned["data_dir"] = "/data"
    tuned["config"]["data_mount"] = {"path": "/data", "target": "/data", "source": "/dev/md0", "fstype": "xfs",
                                     "options": ["rw", "noatime"]}
    checks = by_id(smoke.evaluate(tuned))
    shell = checks["config.threads.login_shell"]
    assert shell.status == smoke.FAIL and "OPENBLAS_NUM_THREADS is unset" in shell.reason
    assert checks["config.threads.systemd_service"].status == smoke.SKIP
    assert checks["config.thp.enabled"].status == smoke.FAIL
    assert checks["config.data_mount"].status == smoke.PASS
    # A defrag policy of two words, as the plan (plan_thp_defrag) and the probe both name it.
    tuned["plan"]["thp_defrag"] = tuned["config"]["thp"]["defrag"] = "defer+madvise"
    assert by_id(smoke.evaluate(tuned))["config.thp.defrag"].status == smoke.PASS


@pytest.mark.parametrize(("text", "word"), sysfs_cases.BRACKETED)
def test_the_probe_reads_thps_chosen_word(text, word):
    from provisioner.smoke.target import probe

    assert probe.bracketed(text) == word


def test_torch_threads_must_match_the_plan(tuned):
    tuned["results"]["mlp"]["threads"] = 1
    c = by_id(smoke.evaluate(tuned))["torch.mlp"]
    assert c.status == smoke.FAIL and "plan says 2" in c.reason


def test_a_run_more_than_15_percent_worse_is_a_regression(raw):
    before = smoke.evaluate(raw)
    worse = copy.deepcopy(raw)
    slower(worse["results"]["gemm"]["dgemm_all"], 0.8)  # -20%
    slower(worse["results"]["gemm"]["sgemm_all"], 0.9)  # -10%: noise, not a regression
    worse["results"]["inference"]["p99_us"] *= 1.5  # latency: higher is worse
    now = smoke.evaluate(worse)
    smoke.flag_regressions(now, before)
    checks = by_id(now)
    assert checks["compute.dgemm_all"].regression and checks["compute.dgemm_all"].status == smoke.WARN
    assert "20% worse" in checks["compute.dgemm_all"].reason
    assert not checks["compute.sgemm_all"].regression
    assert checks["inference.p99"].regression
    assert now.previous_started == before.started


def test_baseline_figures_sit_next_to_the_tuned_ones(raw, tuned):
    base = smoke.evaluate(raw)
    tuned["results"]["hpo"]["runs"]["parallel"]["trials_per_min"] = 60.0
    after = smoke.evaluate(tuned)
    smoke.attach_baseline(after, base)
    c = by_id(after)["hpo.parallel"]
    assert c.baseline == pytest.approx(raw["results"]["hpo"]["runs"]["parallel"]["trials_per_min"])
    assert c.baseline is not None
    assert c.gain == pytest.approx(60.0 / c.baseline)
    p99 = by_id(after)["inference.p99"]
    assert p99.gain == pytest.approx(1.0)  # lower-is-better figures: before / after


def test_history_keeps_runs_per_host_and_finds_the_last(raw, tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path))
    first = smoke.judge("h1", raw)
    assert first.previous_started is None
    second_raw = copy.deepcopy(raw)
    second_raw["started"] = "2026-11-30T20:00:00Z"
    slower(second_raw["results"]["gemm"]["dgemm_all"], 0.5)
    second = smoke.judge("h1", second_raw)
    assert second.previous_started == raw["started"]
    assert by_id(second)["compute.dgemm_all"].regression
    latest = smoke.latest("h1", "baseline", "quick")
    assert latest is not None
    assert latest.started == "2026-11-30T20:00:00Z"
    assert smoke.latest("h2", "baseline", "quick") is None
    assert len(list((tmp_path / "smoke" / "h1").glob("*.json"))) == 2


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for k, v in attrs:
            if k in ("src", "href") and v and not v.startswith("#"):
                self.external.append(v)


def test_html_report_is_self_contained_with_charts(raw, tuned):
    base = smoke.evaluate(raw)
    after = smoke.evaluate(tuned)
    smoke.attach_baseline(after, base)
    text = report.render_html([after, base])
    parser = _Collect()
    parser.feed(text)
    assert "script" not in parser.tags and not parser.external  # one file, nothing fetched
    svgs = [s + "</svg>" for s in ("<svg" + part.split("</svg>")[0] for part in text.split("<svg")[1:])]
    assert len(svgs) >= 20
    for svg in svgs:
        ET.fromstring(svg.replace('role="img"', ""))  # well-formed SVG
    assert "DGEMM, all cores" in text and "before" in text
    assert text.count("<h2") == 2


def test_html_report_names_each_figures_prometheus_series(tuned):
    from prometheus_client.parser import text_string_to_metric_families

    from provisioner import metrics

    result = smoke.evaluate(tuned)
    text = report.render_html([result])
    assert all(name in text for name in (metrics.FIGURE, metrics.LIMIT, metrics.RATIO, metrics.STATUS))
    families = text_string_to_metric_families(metrics.smoke_text(result))
    exported = {s.labels["check"] for f in families for s in f.samples if "check" in s.labels}
    shown = set(re.findall(r'check=&#34;([^&]+)&#34;|check="([^"]+)"', text))
    assert exported and exported <= {a or b for a, b in shown}


def test_report_escapes_what_hosts_report(raw):
    raw["cpu"]["model_name"] = "<script>alert(1)</script>"
    text = report.render_html([smoke.evaluate(raw)])
    assert "<script>" not in text


def test_html_report_renders_in_a_headless_browser(raw, tuned, tmp_path):
    import os
    import shutil
    import subprocess

    browser = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    if not browser:
        if os.environ.get("PROVISIONER_REQUIRE_LAB") == "1":
            pytest.fail("chromium-headless-shell is not installed: run bash install.sh --test")
        pytest.skip("chromium-headless-shell is not installed (bash install.sh --test installs it)")
    base = smoke.evaluate(raw)
    after = smoke.evaluate(tuned)
    smoke.attach_baseline(after, base)
    page = report.write_html([after], tmp_path / "report.html")
    flags = ["--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # The browser parsed the page: every chart is an SVG element in its DOM, the tables are there.
    assert dom.stdout.count("<svg") == report.render_html([after]).count("<svg") >= 20
    assert "DGEMM, all cores" in dom.stdout
    shot = tmp_path / "report.png"
    r = subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=1200,2400", page.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000  # a page with content, not a blank one


def test_a_busy_host_is_said_to_be_busy(raw):
    raw["cpu_busy_before"] = 0.05
    idle = by_id(smoke.evaluate(raw))["host.load"]
    assert idle.status == smoke.PASS and idle.figure == pytest.approx(5.0)
    raw["cpu_busy_before"] = 0.8
    busy = by_id(smoke.evaluate(raw))["host.load"]
    assert busy.status == smoke.WARN and "other work was running" in busy.reason
    before = smoke.evaluate(raw)
    raw["cpu_busy_before"] = 0.01
    now = smoke.evaluate(raw)
    smoke.flag_regressions(now, before)
    smoke.attach_baseline(now, before)
    assert not by_id(now)["host.load"].regression and by_id(now)["host.load"].gain is None


def test_a_drop_within_the_runs_own_spread_is_noise_not_a_regression(raw):
    inf = raw["results"]["inference"]
    inf["p99_us_each"] = [250.0, 280.0, 300.0, 420.0, 330.0]
    inf["p99_us"] = 300.0
    last = smoke.evaluate(raw)
    by_id(last)["inference.p99"].figure = 255.0  # the last run's p99, inside this run's 250-420
    now = smoke.evaluate(raw)
    assert by_id(now)["inference.p99"].spread == [250.0, 420.0]
    smoke.flag_regressions(now, last)
    assert not by_id(now)["inference.p99"].regression
    by_id(last)["inference.p99"].figure = 200.0  # below anything this run measured: a regression
    now = smoke.evaluate(raw)
    smoke.flag_regressions(now, last)
    assert by_id(now)["inference.p99"].regression


# ---------------------------------------------------------------- serving: wrk, judgement, chart, cost


@pytest.fixture
def serving_runs():
    """The serving workload as measured on this 2-core VM: a throwaway model server, 200 XGBoost trees of
    depth 6 on 28 features; tuned (2 workers x 1 thread, each on its CPU) and baseline (1 worker, 2 threads)."""
    return json.loads((DATA / "smoke_serving_runs.json").read_text())


@pytest.fixture
def served(raw, tuned, serving_runs):
    """(baseline, tuned) raw figures with the measured serving workload in each."""
    raw["results"]["serving"] = copy.deepcopy(serving_runs["baseline"]["serving"])
    tuned["results"]["serving"] = copy.deepcopy(serving_runs["tuned"]["serving"])
    return raw, tuned


def level(result: dict, connections: int) -> dict:
    return next(lv for lv in result["results"]["serving"]["levels"] if lv["connections"] == connections)


def set_level(result: dict, connections: int, wrk: dict) -> None:
    """Put one parsed wrk run in as the level's only run, with its medians and sums."""
    lv = level(result, connections)
    lv["runs"] = [wrk]
    lv.update({k: wrk.get(k) for k in ("requests_per_s", "p50_ms", "p90_ms", "p99_ms")})
    lv["socket_errors"] = sum(wrk["socket_errors"].values())
    lv["non_2xx"] = wrk["non_2xx"]
    lv["requests"] = wrk["requests"]


def test_serving_requests_per_second_are_held_against_the_in_process_rate_times_the_cores(served):
    _base, tuned = served
    c = by_id(smoke.evaluate(tuned))
    rps, inproc = c["serving.rps"], tuned["results"]["serving"]["inproc"]["per_s"]
    assert rps.figure == level(tuned, 8)["requests_per_s"]
    assert rps.limit == pytest.approx(inproc * 2)  # 2 physical cores
    assert rps.figure is not None and rps.limit is not None
    assert rps.ratio == pytest.approx(rps.figure / rps.limit) and rps.status == smoke.PASS
    assert "of the in-process rate x 2 cores" in rps.reason and "one thread" in rps.basis
    p99 = c["serving.p99"]
    assert p99.figure == level(tuned, 8)["p99_ms"] and p99.limit == 20.0 and p99.status == smoke.PASS
    assert not p99.higher_is_better and c["serving.errors"].status == smoke.PASS
    assert c["serving.rps_c1"].status == c["serving.rps_c32"].status == c["serving.inproc"].status == smoke.INFO
    assert "p99" in c["serving.rps_c32"].reason


def test_the_in_process_rate_names_the_predictor_engine_its_load_chose(served):
    """A raw result from before the engines has no engine and reads as it did; one that has it names it."""
    _, tuned = served
    assert "predicted by" not in by_id(smoke.evaluate(tuned))["serving.inproc"].reason
    why = "onedal: 13.0 µs a row against native 85.3 µs, the same predictions"
    tuned["results"]["serving"]["inproc"].update(engine="onedal", engine_reason=why)
    reason = by_id(smoke.evaluate(tuned))["serving.inproc"].reason
    assert reason.endswith(f" per row, predicted by onedal ({why})"), reason
    # The HTTP figure is then held against the framework's own rate, not the engine's: the engine
    # makes the trees so fast that HTTP and JSON bound the server.
    rps_before = by_id(smoke.evaluate(tuned))["serving.rps"]
    inproc = tuned["results"]["serving"]["inproc"]
    inproc["native_per_s"], inproc["per_s"] = inproc["per_s"], inproc["per_s"] * 7
    rps = by_id(smoke.evaluate(tuned))["serving.rps"]
    assert (rps.limit, rps.ratio, rps.status) == (rps_before.limit, rps_before.ratio, rps_before.status)
    assert "the framework's own predict" in rps.basis and "onedal predicts at" in rps.basis, rps.basis


def test_serving_below_the_grades_warns_then_fails(served):
    _, tuned = served
    limit = by_id(smoke.evaluate(tuned))["serving.rps"].limit
    ok, warn = smoke.SERVING_GRADES
    figure = by_id(smoke.evaluate(tuned))["serving.rps"].figure
    assert figure is not None and limit is not None
    tuned["results"]["serving"]["inproc"]["per_s"] *= figure / limit / ((ok + warn) / 2)
    c = by_id(smoke.evaluate(tuned))["serving.rps"]
    assert c.status == smoke.WARN and c.ratio == pytest.approx((ok + warn) / 2) and "too few workers" in c.reason
    tuned["results"]["serving"]["inproc"]["per_s"] *= 3
    assert by_id(smoke.evaluate(tuned))["serving.rps"].status == smoke.FAIL


def test_serving_p99_over_the_budget_warns_then_fails(served):
    _, tuned = served
    level(tuned, 8)["p99_ms"] = 35.0
    assert by_id(smoke.evaluate(tuned))["serving.p99"].status == smoke.WARN
    level(tuned, 8)["p99_ms"] = 51.0
    c = by_id(smoke.evaluate(tuned))["serving.p99"]
    assert c.status == smoke.FAIL and c.ratio == pytest.approx(51 / 20)


@pytest.mark.parametrize("capture", ["wrk_c8_404.txt", "wrk_c32_drained.txt"])
@pytest.mark.parametrize("connections", [1, 32])
def test_any_failed_request_at_any_level_fails_serving(served, capture, connections):
    _, tuned = served
    set_level(tuned, connections, serving.parse_wrk((DATA / capture).read_text()))
    c = by_id(smoke.evaluate(tuned))
    errors = c["serving.errors"]
    assert errors.status == smoke.FAIL and errors.figure is not None and errors.figure > 0
    assert f"{connections} connections:" in c["serving.errors"].reason
    assert c["serving.rps"].status == smoke.FAIL and "failed requests under load" in c["serving.rps"].reason


def test_serving_without_wrk_or_the_in_process_rate_says_why(served):
    base, tuned = served
    base["results"]["serving"] = {"skipped": "wrk is not installed (the Debian package wrk; role common installs it)"}
    c = by_id(smoke.evaluate(base))["serving.rps"]
    assert c.status == smoke.SKIP and "Debian package wrk" in c.reason
    tuned["results"]["serving"]["inproc"] = None
    tuned["results"]["serving"]["inproc_error"] = "serving_model: exited 1: PermissionError"
    c = by_id(smoke.evaluate(tuned))["serving.rps"]
    assert c.status == smoke.INFO and c.limit is None and "PermissionError" in c.reason


def test_serving_before_and_after(served):
    base, tuned = served
    before, after = smoke.evaluate(base), smoke.evaluate(tuned)
    smoke.attach_baseline(after, before)
    c = by_id(after)
    assert c["serving.rps"].baseline == level(base, 8)["requests_per_s"]
    assert c["serving.rps"].gain == pytest.approx(level(tuned, 8)["requests_per_s"] / level(base, 8)["requests_per_s"])
    assert c["serving.p99"].gain == pytest.approx(level(base, 8)["p99_ms"] / level(tuned, 8)["p99_ms"])  # lower is better
    assert set(after.curves) == {"tuned", "baseline"}
    assert [p["connections"] for p in after.curves["baseline"]] == [1, 8, 32]


def test_the_latency_chart_is_in_the_report_with_tuned_and_baseline(served):
    base, tuned = served
    before, after = smoke.evaluate(base), smoke.evaluate(tuned)
    smoke.attach_baseline(after, before)
    text = report.render_html([after])
    charts = [s.split("</svg>")[0] + "</svg>" for s in text.split('<svg class="chart"')[1:]]
    assert len(charts) == 1
    svg = ET.fromstring('<svg class="chart"' + charts[0].replace('role="img"', ""))
    ns = {"s": "http://www.w3.org/2000/svg"}
    lines = svg.findall("polyline") + svg.findall("s:polyline", ns)
    assert len(lines) == 4  # p50 and p99, tuned and baseline
    labels = [t.text for t in svg.iter() if t.tag.endswith("text")]
    assert {"tuned p50", "tuned p99", "baseline p50", "baseline p99", "p99 budget"} <= set(labels)
    assert {"1", "8", "32"} <= set(labels)  # connections on the x axis
    tips = [t.text for t in svg.iter() if t.tag.endswith("title")]
    assert any(f"tuned p99 at 8 connections: {level(tuned, 8)['p99_ms']:.2f} ms" in (t or "") for t in tips)
    only = report.render_html([before])  # a baseline alone: its own curve
    assert only.count('<svg class="chart"') == 1 and "baseline p99" in only and "tuned p50" not in only


def test_no_serving_workload_no_chart(raw):
    assert '<svg class="chart"' not in report.render_html([smoke.evaluate(raw)])


def test_cost_arithmetic():
    assert smoke.hourly_price(730.0) == pytest.approx(1.0)  # a month is 730 hours
    assert smoke.cost_per_million(1000.0, 3.6) == pytest.approx(1.0)  # 1,000 s at $0.001/s
    assert smoke.cost_per_million(2000.0, 3.6) == pytest.approx(0.5)
    assert smoke.cost_per_trial(60.0, 3.6) == pytest.approx(0.001)  # 3,600 trials an hour
    # c5.4xlarge at $0.68/h serving 5,000 requests/s: 1e6 / 5000 s x 0.68 / 3600 $/s
    assert smoke.cost_per_million(5000.0, 0.68) == pytest.approx(200 * 0.68 / 3600)


def test_cost_view_with_a_monthly_price(served):
    base, tuned = served
    prices = {"c5.4xlarge": 0.68, "r5.4xlarge": 1.008, "c7a.4xlarge": 0.82}
    tuned["cost"] = {"price_per_month": 146.0, "cloud_prices": prices}
    after = smoke.evaluate(tuned)
    c = by_id(after)
    rps, trials = c["serving.rps"].figure, c["hpo.parallel"].figure
    assert rps is not None and trials is not None
    assert c["cost.serving.host"].figure == pytest.approx(1e6 / rps * (146 / 730) / 3600)
    assert c["cost.hpo.host"].figure == pytest.approx((146 / 730) / (trials * 60))
    for name, per_hour in prices.items():
        assert c[f"cost.serving.{name}"].figure == pytest.approx(1e6 / rps * per_hour / 3600)
        assert c[f"cost.hpo.{name}"].figure == pytest.approx(per_hour / (trials * 60))
    assert {x.status for x in after.checks if x.group == "cost"} == {smoke.INFO}
    assert "$146.00 a month = $0.2000/h (730 h)" in c["cost.serving.host"].reason
    # The baseline ran without a price: its cost is its throughput at this run's price.
    before = smoke.evaluate(base)
    assert not any(x.group == "cost" for x in before.checks)
    smoke.attach_baseline(after, before)
    cost = by_id(after)["cost.serving.host"]
    assert cost.baseline == pytest.approx(1e6 / level(base, 8)["requests_per_s"] * (146 / 730) / 3600)
    assert cost.gain == pytest.approx(rps / level(base, 8)["requests_per_s"])
    text = report.render_html([after])
    assert "$ per 1M predictions, c5.4xlarge" in text and "$/trial" in text


def test_no_price_no_cost_view_and_a_price_change_is_no_regression(served):
    _, tuned = served
    tuned["cost"] = {"price_per_month": None, "cloud_prices": {"c5.4xlarge": 0.68}}
    assert not any(c.group == "cost" for c in smoke.evaluate(tuned).checks)
    tuned["cost"]["price_per_month"] = 100.0
    last = smoke.evaluate(tuned)
    tuned["cost"]["price_per_month"] = 300.0  # three times the cost, the same throughput
    now = smoke.evaluate(tuned)
    smoke.flag_regressions(now, last)
    assert not by_id(now)["cost.serving.host"].regression


# The smoke role's option checks as the input check runs them (control node only), for all the
# cases below in one ansible-playbook run (playbook_cases): one host per case, its variables the
# case's input. The hosts do not exist: a refusal must come before anything reaches them.
OPTIONS_PLAY = [{
    "name": "Input", "hosts": "all", "gather_facts": False,
    "tasks": [{"name": "Check the input of role smoke",
               "ansible.builtin.include_role": {"name": "smoke", "tasks_from": "preflight"}}],
}]
BAD_PRICES = [
    ({"smoke_price_per_month": "cheap"}, "smoke_price_per_month must be the host's price per month in dollars"),
    ({"smoke_price_per_month": -120}, "smoke_price_per_month must be the host's price per month in dollars"),
    ({"smoke_price_per_month": 0}, "smoke_price_per_month must be the host's price per month in dollars"),
    ({"smoke_cloud_prices": {"c5.4xlarge": "a lot"}}, "smoke_cloud_prices must map instance names"),
    ({"smoke_cloud_prices": {"c5.4xlarge": -1}}, "smoke_cloud_prices must map instance names"),
]
PRICE_HOSTS = {f"price{i}.invalid": extra for i, (extra, _) in enumerate(BAD_PRICES)}
CONFIG_ONLY = "config-only.invalid"  # baseline mode: no tuned configuration to check
GOOD_PRICE = "good-price.invalid"


@pytest.fixture(scope="module")
def options_run(tmp_path_factory):
    from playbook_cases import run_cases

    hosts = {
        **PRICE_HOSTS,
        CONFIG_ONLY: {"smoke_config_only": True},
        GOOD_PRICE: {"smoke_price_per_month": 450, "smoke_cloud_prices": {"c5.4xlarge": 0.68, "mine": 1}},
    }
    return run_cases(tmp_path_factory, "smoke-options", OPTIONS_PLAY, hosts, cwd=ROOT, args=["-e", "smoke_mode=baseline"])


def test_a_run_with_bad_options_fails(options_run):
    assert options_run.returncode != 0, options_run.tail()


@pytest.mark.parametrize(("host", "extra", "says"), [(h, *case) for h, case in zip(PRICE_HOSTS, BAD_PRICES, strict=True)],
                         ids=list(PRICE_HOSTS))
def test_a_bad_price_is_refused_before_any_host_is_reached(options_run, host, extra, says):
    failed = options_run.failed(host)
    assert len(failed) == 1, failed
    name, result = failed[0]
    assert not result.get("unreachable")
    assert name == f"smoke : Check {next(iter(extra))}"
    msg = result["msg"]
    assert msg.startswith(says) and "\n" not in msg.strip(), msg
    assert str(next(iter(extra.values()))).split(":")[0].strip("{'") in msg  # the value refused


def test_the_configuration_alone_in_baseline_mode_is_refused_before_any_host_is_reached(options_run):
    failed = options_run.failed(CONFIG_ONLY)
    assert [(name, bool(h.get("unreachable"))) for name, h in failed] == [("smoke : Check smoke_config_only", False)]
    msg = failed[0][1]["msg"]
    assert msg.startswith("smoke_config_only checks the tuned configuration and runs no workload: not with smoke_mode=baseline")
    assert "\n" not in msg.strip(), msg


def test_a_good_price_passes_the_option_checks(options_run):
    checks = [(name, h) for name, h in options_run.results(GOOD_PRICE) if name.startswith("smoke : Check smoke_")]
    assert len(checks) == 3 and not any(h.get("failed") for _, h in checks)


def test_a_config_only_run_measures_no_workload_and_needs_no_ml_environment(tmp_path):
    """The zipapp for real on this machine, under the system Python's standard library only (-S -E -s),
    with an ML environment's python that does not exist: the configuration and the host's load are
    read, no workload starts, and only those checks come out."""
    import os
    import sys

    from provisioner.smoke import zipapp

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"values": {"threads_per_job": 3, "thp_enabled": "never"}}))
    user = __import__("pwd").getpwuid(os.getuid()).pw_name
    r = subprocess.run(
        [sys.executable, "-S", "-E", "-s", str(zipapp.build(tmp_path)), "run", "--python", str(tmp_path / "no/python"),
         "--mode", "tuned", "--plan", str(plan), "--user", user, "--data-dir", str(tmp_path / "nowhere"), "--config-only"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    raw = json.loads(r.stdout)
    assert raw["results"] == {} and raw["plan"]["threads_per_job"] == 3
    assert {"login_shell", "systemd_service", "thp", "governor", "data_mount"} <= set(raw["config"])
    judged = smoke.evaluate(raw)
    assert {c.group for c in judged.checks} == {"host", "configuration"} and judged.workloads == {}
    checks = {c.id: c for c in judged.checks}
    # The plan's 3 threads are nowhere in this machine's login shell: the check says so.
    assert checks["config.threads.login_shell"].status == smoke.FAIL
    assert "the plan says 3 (role thread_env)" in checks["config.threads.login_shell"].reason
    assert checks["config.data_mount"].reason.startswith(f"no data mount at {tmp_path / 'nowhere'}: work files go to ")
