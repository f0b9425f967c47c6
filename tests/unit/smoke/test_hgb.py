"""The HistGradientBoosting workload: run only when named, a real (tiny) fit here, and its check
against its own one-thread run x the cores."""

from __future__ import annotations

import importlib.util

import pytest

from provisioner import smoke
from provisioner.smoke.workloads import BY_NAME, CLUSTER_TASKS, PROFILES, TASKS, WORKERS, hgb


def raw_hgb(all_rate: float, one_rate: float = 1e6, cores: int = 16) -> dict:
    """A recorded raw result: the all-thread and one-thread rates in row-iterations/s on `cores`."""

    def run(rate: float, iterations: int, threads) -> dict:
        return {"iterations": iterations, "threads": threads, "times_s": [1.0], "row_iterations_per_s": rate}

    return {
        "mode": "tuned",
        "threads": cores,
        "results": {
            "hgb": {
                "rows": 200_000,
                "cols": 28,
                "iterations": 50,
                "sklearn": "1.5.2",
                "all": run(all_rate, 50, cores),
                "one": run(one_rate, 50, 1),
            }
        },
    }


def test_it_is_registered_and_runs_only_when_named():
    assert BY_NAME["hgb"] is hgb and WORKERS["hgb"] is hgb.w_hgb
    assert hgb.ONLY_WHEN_NAMED and "hgb" not in TASKS and "hgb" in CLUSTER_TASKS
    assert {k for k in PROFILES["quick"] if k.startswith("hgb_")} == set(hgb.SIZES["quick"])


@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="scikit-learn is not installed here")
def test_a_tiny_fit_gives_the_all_thread_and_one_thread_rates(monkeypatch):
    monkeypatch.setitem(hgb.SIZES, "quick", {"hgb_rows": 2000, "hgb_cols": 5, "hgb_iterations": 3, "hgb_repeats": 1})
    out = hgb.w_hgb({"profile": "quick", "mode": "tuned", "threads": 2})
    assert out["rows"] == 2000 and out["iterations"] == 3 and out["sklearn"], out
    assert out["all"]["row_iterations_per_s"] > 0 and out["one"]["row_iterations_per_s"] > 0
    assert out["one"]["threads"] == 1 and len(out["all"]["times_s"]) == 1
    (check,) = hgb.checks({"threads": 2}, out)
    assert check.id == "hgb" and check.figure is not None and check.figure > 0


@pytest.mark.parametrize(("all_rate", "status"), [(8e6, smoke.PASS), (3.2e6, smoke.WARN), (2e6, smoke.FAIL)])
def test_the_check_holds_the_rate_to_the_one_thread_run_times_the_cores(all_rate, status):
    raw = raw_hgb(all_rate)
    (check,) = hgb.checks(raw, raw["results"]["hgb"])
    assert check.status == status, check.reason
    assert check.limit == pytest.approx(16.0) and "one-thread rate" in check.basis and "1 -> 16 cores" in check.reason


def test_more_threads_slower_than_one_fails_and_the_judgement_runs_it():
    raw = raw_hgb(0.9e6, cores=2)  # 45% of linear, but slower than one thread
    (check,) = hgb.checks(raw, raw["results"]["hgb"])
    assert check.status == smoke.FAIL
    assert [c.id for c in smoke.evaluate(raw).checks if c.group != "configuration"] == ["hgb"]
