"""The feature pipeline's root-parent step: Polars on its planned threads, then on one, each a process."""

from __future__ import annotations

from provisioner.smoke.workloads import features


def test_polars_one_thread_run_is_a_process_of_its_own():
    class Runner:
        def __init__(self):
            self.calls = []

        def worker(self, task, **extra):
            self.calls.append((task, extra))
            return {"polars": {"threads": extra.get("polars_threads", 2), "rows_per_s": 1.0}, "rows": 10}

    runner = Runner()
    out = features.drive(runner)
    assert runner.calls == [("features", {}), ("features", {"polars_threads": 1, "pandas": False})]
    assert out["polars"]["threads"] == 2 and out["polars_one"]["threads"] == 1
