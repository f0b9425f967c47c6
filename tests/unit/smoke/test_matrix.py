"""The in-RAM feature matrix's measuring function, for real on a small matrix."""

from __future__ import annotations

import pytest

from provisioner import smoke
from provisioner.smoke.workloads import matrix


def test_the_matrix_is_cross_validated_over_views_of_itself(tmp_path, monkeypatch):
    """The real worker on a small matrix: ridge over contiguous folds fits the planted model."""
    monkeypatch.setitem(matrix.SIZES, "quick", {**matrix.SIZES["quick"], "matrix_rows": 4003})
    out = matrix.w_matrix({"profile": "quick", "mode": "tuned", "threads": 1, "workdir": str(tmp_path),
                           "plan": {"feature_matrix_features": 20, "feature_matrix_rows": 10_000}})
    assert out["rows"] == 4000 and out["features"] == 20 and out["folds"] == 4  # a whole number of folds
    assert out["r2"] > 0.8 and out["swapped_out_pages"] >= 0 and out["planned_from_plan"]
    assert out["planned_bytes"] == 10_000 * 20 * 4 and out["cv_gflops"] > 0 and out["sgemm_gflops"] > 0
    checks = {c.id: c for c in smoke.evaluate({"mode": "tuned", "results": {"matrix": out}}).checks}
    assert checks["matrix.memory"].limit == pytest.approx(0.0008) and "the plan's largest" in checks["matrix.memory"].basis
