"""GEMM's target code: the BLAS kernel verdict mlstack-doctor gives, and the clock counted in cycles."""

from __future__ import annotations

from pathlib import Path

from provisioner.smoke.workloads import gemm

ROOT = Path(__file__).resolve().parents[3]


def test_the_smoke_script_asks_the_doctor_about_the_kernel(tmp_path, monkeypatch):
    """The target script loads mlstack-doctor from the environment it runs in, and its verdict."""
    import shutil

    monkeypatch.setattr(gemm.sys, "prefix", str(tmp_path))
    assert gemm.blas_kernel_verdict([]) is None  # no doctor here: a baseline environment
    (tmp_path / "bin").mkdir()
    shutil.copy(ROOT / "roles/mlstack/files/mlstack-doctor", tmp_path / "bin" / "mlstack-doctor")
    info = [{"user_api": "blas", "internal_api": "openblas", "architecture": "Prescott", "filepath": "/x/libopenblas.so"}]
    verdict = gemm.blas_kernel_verdict(info)
    assert verdict is not None
    assert verdict["name"] == "blas-kernel"
    flags = (Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0]).split()
    if "avx2" in flags or "avx512f" in flags:
        assert verdict["status"] == "fail" and "Prescott kernel" in verdict["detail"], verdict


def test_the_script_counts_the_clock_on_one_core_and_on_all_at_once():
    import os
    import platform

    result = gemm.w_clock({"threads": 64})
    if platform.machine().lower() not in ("x86_64", "amd64"):
        assert "x86-64" in result["unavailable"]
        return
    cpus = gemm.core_cpus() or sorted(os.sched_getaffinity(0))
    assert result["all"]["cpus"] == cpus and len(result["all"]["per_core_mhz"]) == len(cpus)  # one per core, capped
    assert 500 < result["one"]["mhz"] < 7000 and 500 < result["all"]["mhz"] < 7000
    assert result["one"]["mhz"] == max(result["one"]["repeats_mhz"]) and len(result["one"]["repeats_mhz"]) == 7
    assert "dependent `add rax, rdx`" in result["method"]


def test_the_script_says_why_it_cannot_count_the_clock(monkeypatch):
    import mmap

    monkeypatch.setattr(gemm.platform, "machine", lambda: "aarch64")
    assert "x86-64 machine code and this CPU is aarch64" in gemm.w_clock({"threads": 1})["unavailable"]
    monkeypatch.setattr(gemm.platform, "machine", lambda: "x86_64")

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(mmap, "mmap", refused)
    assert "executable memory mapping is refused (Permission denied" in gemm.w_clock({"threads": 1})["unavailable"]
