"""The STREAM triad's measuring function, for real with numpy on a small array."""

from __future__ import annotations

from provisioner.smoke.workloads import triad


def test_the_triad_moves_its_arrays_and_times_each_repeat(monkeypatch):
    monkeypatch.setitem(triad.SIZES, "quick", {"triad_n": 100_000, "triad_repeats": 3})
    out = triad.w_triad({"profile": "quick"})
    assert out["n"] == 100_000 and len(out["times_s"]) == 3 and out["gbps"] > 0
    assert out["bytes_moved"] in (3 * 8 * 100_000, 5 * 8 * 100_000)  # torch's one pass, numpy's two
    assert triad.checks({"memory": {}}, out)[0].figure == out["gbps"]
    # tune's objective (THP's mode moves it) is the figure the smoke test judges, from the same run.
    assert triad.TUNE.figure(out) == out["gbps"] and triad.TUNE.higher_is_better
