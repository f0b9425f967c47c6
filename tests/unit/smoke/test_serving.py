"""The serving workload's target code: wrk's output, the throwaway server's workers, the deployed
server's readiness, the skips, the free ports."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from provisioner.smoke.workloads import serving

DATA = Path(__file__).resolve().parents[1] / "data"


def test_wrk_output_is_parsed_with_its_units():
    ok = serving.parse_wrk((DATA / "wrk_c8_ok.txt").read_text())
    assert ok["requests_per_s"] == pytest.approx(2869.90)
    assert (ok["p50_ms"], ok["p75_ms"], ok["p90_ms"], ok["p99_ms"]) == pytest.approx((2.46, 2.92, 4.43, 6.58))
    assert ok["requests"] == 8895 and ok["seconds"] == pytest.approx(3.10)
    assert ok["mean_ms"] == pytest.approx(2.81) and ok["max_ms"] == pytest.approx(12.93)
    assert ok["socket_errors"] == {} and ok["non_2xx"] == 0
    missing = serving.parse_wrk((DATA / "wrk_c8_404.txt").read_text())  # an unknown model: every answer a 404
    assert missing["non_2xx"] == missing["requests"] == 25720
    assert missing["p50_ms"] == pytest.approx(0.506) and missing["mean_ms"] == pytest.approx(0.71803)  # µs -> ms
    drained = serving.parse_wrk((DATA / "wrk_c32_drained.txt").read_text())  # the server stopped under load
    assert drained["socket_errors"] == {"connect": 0, "read": 0, "write": 68756, "timeout": 0}
    with pytest.raises(ValueError, match="no Requests/sec line: unable to connect"):
        serving.parse_wrk("unable to connect to 127.0.0.1:18939 Connection refused\n")


def test_the_throwaway_servers_workers_come_from_the_plan_or_the_naive_setup():
    import os

    plan = {"workers": 2, "threads_per_worker": 1, "worker_cpus": [[0, 2], [1, 3]]}
    workers, how = serving.serving_workers("tuned", plan)
    assert workers == [{"index": 0, "cpus": [0, 2], "threads": 1}, {"index": 1, "cpus": [1, 3], "threads": 1}]
    assert "2 workers x 1 thread" in how
    with pytest.raises(RuntimeError, match="the plan has no serving section"):
        serving.serving_workers("tuned", None)
    allowed = sorted(os.sched_getaffinity(0))
    workers, how = serving.serving_workers("baseline", plan)  # the naive setup ignores the plan
    assert workers == [{"index": 0, "cpus": allowed, "threads": len(allowed)}] and "one worker" in how


@pytest.mark.parametrize("threads", [1, 2, 4, 8])
def test_a_tune_measurement_slices_the_cores_as_the_plan_would_for_its_threads(threads):
    # The candidate's threads per worker (its workers following, cores // threads, as the plan's do):
    # the slices `up` would give the workers once the value is written back.
    from facts_fixtures import load

    from provisioner.plan import PlanOptions, core_cpus, derive_plan
    from provisioner.tune import knobs

    facts = load("epyc_4545p")  # 16 cores, two SMT siblings each
    rule = {s.key: s.value for s in derive_plan(facts).settings}
    written = derive_plan(facts, PlanOptions.from_vars({"plan_serving_threads_per_worker": threads})).serving
    assert written is not None
    values = knobs.planned({knobs.SERVING_THREADS: str(threads)}, rule, facts["cpu"]["cores"])
    workers, how = serving.tune_workers(values, core_cpus(facts)[0])
    assert [w["cpus"] for w in workers] == written["worker_cpus"]
    assert {w["threads"] for w in workers} == {threads} and how.startswith(f"{written['workers']} workers x {threads}")


def test_a_tune_measurement_that_would_not_fit_shares_every_core():
    groups = [[0, 2], [1, 3]]
    workers, how = serving.tune_workers({"serving_workers": 2, "serving_threads_per_worker": 2}, groups)
    assert [w["cpus"] for w in workers] == [[0, 1, 2, 3]] * 2 and how == "2 workers x 2 thread(s), each on all 2 cores"
    workers, _ = serving.tune_workers({"serving_workers": 2, "serving_threads_per_worker": 1}, groups)
    assert [w["cpus"] for w in workers] == [[0, 2], [1, 3]]


def test_a_deployed_server_is_measured_only_when_worker_0_says_ready(tmp_path):
    assert serving.deployed_server(str(tmp_path / "none.json")) == (None, f"no deployed model server ({tmp_path / 'none.json'} does not exist)")
    port = serving.free_ports(1)  # nothing listens there
    cfg = tmp_path / "serving.json"
    cfg.write_text(json.dumps({"schema": 1, "registry": str(tmp_path), "listen": "127.0.0.1", "port": 1, "admin_port_base": port}))
    target, why = serving.deployed_server(str(cfg))
    assert target is None and why is not None and f"worker 0 is not ready on 127.0.0.1:{port}" in why
    cfg.write_text("{")
    why = serving.deployed_server(str(cfg))[1]
    assert why is not None and "cannot be read" in why


def test_without_wrk_the_serving_workload_is_skipped_naming_the_package(monkeypatch):
    monkeypatch.setattr(serving.shutil, "which", lambda name: None)
    assert serving.drive(None) == {"skipped": "wrk is not installed (the Debian package wrk; role common installs it)"}


@pytest.mark.parametrize("absent", ["uvicorn", "prometheus_client"])
def test_without_the_serving_component_the_serving_workload_is_skipped_naming_it(monkeypatch, absent):
    """The default stack (core, gbdt) has no HTTP layer: a skip naming the component, not a failure."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == absent else real(name, *a))
    result = serving.w_serving_model({"profile": "quick", "serve_script": "unused", "train": True})
    assert result == {"skipped": f"{absent} is not installed in this environment (component serving)"}


def test_a_worker_gets_jemalloc_preloaded_only_for_the_jemalloc_allocator(monkeypatch, tmp_path):
    from provisioner.smoke.target import http

    # Debian's directory of this Python's architecture, never another's (ld.so would ignore it).
    assert http.lib_dirs()[-1] == "/usr/lib" and all("i386" not in d for d in http.lib_dirs())
    native, other = tmp_path / "x86_64-linux-gnu", tmp_path / "i386-linux-gnu"
    for d in (native, other):
        d.mkdir()
        (d / http.JEMALLOC).write_bytes(b"")
    monkeypatch.setattr(http, "lib_dirs", lambda: [str(native), str(tmp_path)])
    assert http.allocator_env(None) == http.allocator_env("glibc") == {}
    assert http.allocator_env("jemalloc") == {"LD_PRELOAD": str(native / http.JEMALLOC)}
    monkeypatch.setattr(http, "lib_dirs", lambda: [str(tmp_path)])
    with pytest.raises(RuntimeError, match=r"no libjemalloc\.so\.2 for allocator jemalloc .*libjemalloc2; role allocator"):
        http.allocator_env("jemalloc")


def test_a_worker_that_did_not_map_the_preloaded_library_fails_the_measurement():
    from provisioner.smoke.target import http

    libc = next(line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "libc.so" in line)
    http.check_loaded([os.getpid()], {"LD_PRELOAD": libc})  # mapped: nothing said
    http.check_loaded([os.getpid()], {})  # glibc's malloc: nothing to check
    with pytest.raises(RuntimeError, match=r"worker 0 did not load /usr/lib/x/libjemalloc\.so\.2 \(LD_PRELOAD ignored\)"):
        http.check_loaded([os.getpid()], {"LD_PRELOAD": "/usr/lib/x/libjemalloc.so.2"})


def test_free_ports_are_consecutive_and_free():
    import socket

    base = serving.free_ports(3)
    for port in range(base, base + 3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_the_server_is_shipped_with_its_parts_readable_by_the_ml_user(tmp_path):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    for name in ("provisioner_serve.py", "provisioner_serve_app.py", "provisioner_serve_config.py", "other.py"):
        (shipped / name).write_text(f"# {name}\n")
    work = tmp_path / "work"
    work.mkdir()
    serve = serving.ship_server(str(shipped / "provisioner_serve.py"), str(work))
    assert serve == str(work / "provisioner_serve.py")
    assert sorted(p.name for p in work.iterdir()) == ["provisioner_serve.py", "provisioner_serve_app.py",
                                                      "provisioner_serve_config.py"]
    assert all(oct(p.stat().st_mode & 0o777) == "0o644" for p in work.iterdir())


def test_the_serving_model_loads_the_real_server_and_its_parts_from_the_work_directory(tmp_path):
    """The real roles/serving/files, shipped as the drive ships them, load as the worker loads them."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    serve = serving.ship_server(str(root / "roles/serving/files/provisioner_serve.py"), str(tmp_path))
    code = ("import sys; from provisioner.smoke.workloads import serving; "
            f"m = serving._serve_module({serve!r}); print(m.__file__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0 and r.stdout.strip() == serve, r.stderr[-2000:]
