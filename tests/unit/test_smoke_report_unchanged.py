"""The smoke judgement gives the same report for the same raw figures: every recorded raw result
under tests/unit/data (and variants of them that reach the other branches: a workload skipped or
failed, a baseline, a price, a busy host, a baseline and a last run to compare with) is judged
and compared, whole, with the reports kept in smoke_report_golden.json.

The golden file was written by the judgement as it stood before it was split into one module per
workload; regenerate it only for an intended change of a check, figure, reason or key:
.venv/bin/python tests/unit/test_smoke_report_unchanged.py
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from provisioner import smoke

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "smoke_report_golden.json"
# Judged reports as the smoke test kept them on hosts: their "raw" is what the target printed.
JUDGED = {
    "tuned-quick": "smoke_judged_tuned_quick.json",
    "baseline-quick": "smoke_judged_baseline_quick.json",
    "cluster": "smoke_judged_cluster.json",
    "serving": "smoke_judged_serving.json",
}


def load(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


def recorded() -> dict[str, dict[str, Any]]:
    """Every recorded raw result, by name."""
    out = {"raw-baseline": load("smoke_raw_baseline.json")}
    base = load("smoke_raw_baseline.json")
    for mode, run in load("smoke_serving_runs.json").items():
        raw = copy.deepcopy(base)
        raw.update({k: v for k, v in run.items() if k != "serving"}, mode=mode)
        raw["results"] = {"serving": run["serving"]}
        out[f"serving-runs-{mode}"] = raw
    for name, file in JUDGED.items():
        out[f"judged-{name}"] = load(file)["raw"]
    return out


def variants(raws: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The recorded results changed so that the judgement's other branches run too."""
    full = raws["judged-tuned-quick"]
    out: dict[str, dict[str, Any]] = {}

    def vary(name: str, source: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> None:
        raw = copy.deepcopy(source)
        change(raw)
        out[name] = raw

    def result(task: str, value: dict[str, str]) -> Callable[[dict[str, Any]], None]:
        return lambda r: r["results"].__setitem__(task, value)

    for task in sorted({*full["results"], "cluster"}):
        vary(f"{task}-skipped", full, result(task, {"skipped": f"{task} not installed"}))
        vary(f"{task}-error", full, result(task, {"error": f"{task} crashed"}))
    vary("tuned-as-baseline", full, lambda r: r.update(mode="baseline"))
    vary("baseline-as-tuned", raws["raw-baseline"], lambda r: r.update(mode="tuned"))
    vary("priced", full, lambda r: r.update(cost={"price_per_month": 300.0, "cloud_prices": {"c5.4xlarge": 0.68, "x": 0}}))
    vary(
        "serving-priced",
        raws["serving-runs-tuned"],
        lambda r: r.update(cost={"price_per_month": 146.0, "cloud_prices": {"c5.4xlarge": 0.68}}),
    )
    vary("busy", full, lambda r: r.update(cpu_busy_before=0.9))
    vary("no-load-figure", full, lambda r: r.pop("cpu_busy_before"))
    vary("no-cpufreq", full, lambda r: r["cpu"].update(cpufreq=False))
    vary("no-clock", full, lambda r: r.update(cpu={k: v for k, v in r["cpu"].items() if not k.endswith("mhz")}))
    vary("no-dimms", full, lambda r: r["memory"].update(dimms=[]))
    vary("gbdt-lightgbm-error", full, lambda r: r["results"]["gbdt"].__setitem__("lightgbm", {"error": "no lightgbm"}))
    vary("features-one-skipped", full, lambda r: r["results"]["features"].__setitem__("polars_one", {"skipped": "one thread"}))
    vary("torch-threads-wrong", full, lambda r: r["results"]["mlp"].update(threads=99, mkl=False))
    vary("tensorflow-onednn-off", full, lambda r: r["results"]["tensorflow"].update(onednn=False))
    vary("tensorflow-onednn-unknown", full, lambda r: r["results"]["tensorflow"].update(onednn=None))
    vary("serving-no-inproc", full, lambda r: r["results"]["serving"].pop("inproc", None))
    vary("config-missing", full, lambda r: r.update(config={}, plan={}))
    vary("one-core-hpo", full, lambda r: r["results"]["hpo"]["runs"].pop("parallel"))
    return out


def judged(raw: dict[str, Any]) -> dict[str, Any]:
    """The report and the repeat spreads for one raw result, as JSON would keep them (or the error raised)."""
    try:
        report = smoke.evaluate(copy.deepcopy(raw))
        spreads = smoke.repeat_spreads(copy.deepcopy(raw.get("results", {})))
    except Exception as e:  # an error is behaviour too: the same input must raise the same one
        return {"raises": f"{type(e).__name__}: {e}"}
    return json.loads(json.dumps({"report": report.to_dict(), "spreads": spreads}))


def compared(raws: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A tuned run set against its baseline and a last run 30% better on every figure."""
    tuned = smoke.evaluate(copy.deepcopy(raws["judged-tuned-quick"]))
    baseline = smoke.evaluate(copy.deepcopy(raws["judged-baseline-quick"]))
    last = smoke.HostReport.from_dict(tuned.to_dict())
    last.started = "2026-12-01T00:00:00Z"
    for c in last.checks:
        if c.figure:
            c.figure = c.figure * 1.3 if c.higher_is_better else c.figure / 1.3
    smoke.attach_baseline(tuned, baseline)
    smoke.flag_regressions(tuned, last)
    priced = smoke.evaluate(copy.deepcopy(variants(raws)["priced"]))
    smoke.attach_baseline(priced, baseline)
    return json.loads(json.dumps({"against-baseline-and-last": tuned.to_dict(), "priced-against-baseline": priced.to_dict()}))


def outcomes() -> dict[str, Any]:
    raws = recorded()
    every = {**raws, **variants(raws)}
    return {"judged": {name: judged(raw) for name, raw in sorted(every.items())}, "compared": compared(raws)}


def key(check: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(check, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:12]


def stored(out: dict[str, Any]) -> dict[str, Any]:
    """The outcomes with each distinct check kept once (most variants share most checks), by key."""
    table: dict[str, Any] = {}
    kept = copy.deepcopy(out)
    reports = [g["report"] for g in kept["judged"].values() if "report" in g] + list(kept["compared"].values())
    for report in reports:
        for i, check in enumerate(report["checks"]):
            table[key(check)] = check
            report["checks"][i] = key(check)
    return {"checks": table, **kept}


def read_golden() -> dict[str, Any]:
    """The golden file with each check's key replaced by the check again."""
    g = json.loads(GOLDEN.read_text())
    table = g.pop("checks")
    for report in [v["report"] for v in g["judged"].values() if "report" in v] + list(g["compared"].values()):
        report["checks"] = [table[k] for k in report["checks"]]
    return g


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return read_golden()


@pytest.fixture(scope="module")
def now() -> dict[str, Any]:
    return outcomes()


def test_every_recorded_result_is_judged_and_most_reach_a_report(golden):
    assert set(golden["judged"]) >= {"raw-baseline", "serving-runs-tuned", *(f"judged-{n}" for n in JUDGED)}
    reports = [g for g in golden["judged"].values() if "report" in g]
    assert len(reports) > 40
    assert {c["id"].split(".")[0] for g in reports for c in g["report"]["checks"]} >= {
        "host", "config", "compute", "memory", "gbdt", "torch", "hpo", "data", "inference", "serving",
        "sklearn", "features", "matrix", "dataloader", "tensorflow", "cluster", "cost",
    }  # fmt: skip


@pytest.mark.parametrize("name", sorted(outcomes()["judged"]))
def test_each_raw_result_is_judged_as_before(name, golden, now):
    assert now["judged"][name] == golden["judged"][name]


def test_baseline_gains_and_regressions_as_before(golden, now):
    assert now["compared"] == golden["compared"]
    checks = golden["compared"]["against-baseline-and-last"]["checks"]
    assert any(c["regression"] for c in checks) and any(c["gain"] for c in checks)


def test_a_judged_run_is_kept_and_read_back_as_before(tmp_path, monkeypatch, golden):
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path))
    raws = recorded()
    smoke.judge("h1", copy.deepcopy(raws["judged-baseline-quick"]))
    report = smoke.judge("h1", copy.deepcopy(raws["judged-tuned-quick"]))
    kept = smoke.latest("h1", "tuned", "quick")
    assert kept is not None and kept.to_dict(raw=True) == json.loads(json.dumps(report.to_dict(raw=True)))
    assert report.baseline_started == raws["judged-baseline-quick"]["started"]
    want = golden["judged"]["judged-tuned-quick"]["report"]
    assert [c["id"] for c in report.to_dict()["checks"]] == [c["id"] for c in want["checks"]]
    assert [c["status"] for c in report.to_dict()["checks"]] == [c["status"] for c in want["checks"]]


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(stored(outcomes()), indent=1, sort_keys=True, ensure_ascii=False) + "\n")
