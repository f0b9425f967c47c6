"""Single-row predict latency's measuring function, for real with a small XGBoost model."""

from __future__ import annotations

import pytest

from provisioner.smoke.workloads import inference

pytest.importorskip("xgboost")


def test_each_repeat_times_its_single_row_calls(monkeypatch):
    monkeypatch.setitem(inference.SIZES, "quick",
                        {"infer_rows": 2000, "infer_trees": 5, "infer_depth": 3, "infer_calls": 100, "infer_repeats": 2})
    out = inference.w_inference({"profile": "quick", "mode": "baseline"})
    assert len(out["p50_us_each"]) == len(out["p99_us_each"]) == 2 and 0 < out["p50_us"] <= out["p99_us"]
    assert out["threads"] == "library default" and out["library"].endswith("inplace_predict")
    assert "inference.p99" in {c.id for c in inference.checks({}, out)}
