"""The GBDT workload's target code: the rows it trains on, and a real fit of each library installed."""

from __future__ import annotations

import importlib.util

import pytest

from provisioner.smoke.workloads import gbdt


@pytest.mark.parametrize(("threads", "rows"), [(1, 250_000), (2, 250_000), (4, 500_000), (8, 1_000_000), (64, 1_000_000)])
def test_quick_gbdt_gives_each_thread_the_same_rows_within_bounds(threads, rows):
    assert gbdt.gbdt_rows("quick", threads) == rows
    assert gbdt.gbdt_rows("full", threads) == gbdt.SIZES["full"]["gbdt_rows"]


@pytest.mark.skipif(importlib.util.find_spec("xgboost") is None, reason="xgboost is not installed here")
def test_a_small_fit_gives_the_all_core_and_one_core_rates(monkeypatch):
    monkeypatch.setitem(gbdt.SIZES, "full", {**gbdt.SIZES["full"], "gbdt_rows": 5000, "gbdt_trees": 4, "gbdt_trees_one": 2,
                                             "gbdt_depth": 3, "gbdt_repeats": 1})
    out = gbdt.w_gbdt({"profile": "full", "mode": "baseline", "threads": 2})
    assert out["rows"] == 5000 and out["xgboost"]["all"]["row_trees_per_s"] > 0, out
    assert out["xgboost"]["one"]["threads"] == 1
