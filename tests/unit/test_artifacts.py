"""Run artifacts are pruned to the newest few, also with several provisioner runs at once."""

from __future__ import annotations

import os
import threading
import time

from provisioner import engine


def make_runs(root, n):
    for i in range(n):
        d = root / f"run-{i:02d}"
        d.mkdir()
        (d / "stdout").write_text("x")
        os.utime(d, (time.time() - 100 + i, time.time() - 100 + i))


def test_keeps_the_newest(tmp_path):
    make_runs(tmp_path, 25)
    engine.rotate_artifacts(tmp_path, keep=20)
    left = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert left == [f"run-{i:02d}" for i in range(5, 25)]


def test_concurrent_rotations_do_not_trip_over_each_other(tmp_path):
    make_runs(tmp_path, 60)
    errors = []

    def rotate():
        try:
            engine.rotate_artifacts(tmp_path, keep=3)
        except Exception as exc:  # any exception is the failure
            errors.append(exc)

    threads = [threading.Thread(target=rotate) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["run-57", "run-58", "run-59"]
