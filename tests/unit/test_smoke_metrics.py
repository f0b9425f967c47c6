"""The smoke figures as textfile metrics: what the file holds (parsed with prometheus-client's
own text parser), that only tuned runs are published, where they went, and that `smoke` and
`up` both publish. The publish playbook runs for real on this machine (local connection)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_layers import ANSIBLE, TERMINAL, knows

from provisioner import commands, engine, metrics, smoke
from provisioner.errors import ExitCode
from provisioner.runs import HostResult, RunResult
from provisioner.smoke import Check, HostReport, SmokeRun


def report(host: str = "web1", mode: str = "tuned", failing: bool = True) -> HostReport:
    checks = [
        Check("compute.dgemm_all", "compute", "DGEMM, all cores", "pass", "ok", 180.0, "GFLOPS", 200.0, ratio=0.9),
        Check("gbdt.xgboost", "gbdt", "xgboost", "fail" if failing else "warn", "slow", 2.5, "M row-trees/s", 38.0, ratio=2.5 / 38.0),
        Check("torch.mlp", "torch", "PyTorch MLP", "skip", "component torch is not installed"),
        Check("inference.p99", "inference", "p99", "warn", "slowish", 4200.0, "us", 2000.0, ratio=2.1, higher_is_better=False),
    ]
    return HostReport(host, mode, "quick", "2026-12-01T10:00:00Z", 88.0, {}, checks)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_every_figure_limit_ratio_and_status_as_a_metric():
    got = samples(metrics.smoke_text(report()))
    assert got[("provisioner_smoke_figure", (("check", "compute.dgemm_all"), ("unit", "GFLOPS")))] == 180.0
    assert got[("provisioner_smoke_limit", (("check", "gbdt.xgboost"), ("unit", "M row-trees/s")))] == 38.0
    assert got[("provisioner_smoke_ratio", (("check", "compute.dgemm_all"),))] == 0.9
    assert got[("provisioner_smoke_status", (("check", "gbdt.xgboost"), ("status", "fail")))] == 1
    assert got[("provisioner_smoke_status", (("check", "torch.mlp"), ("status", "skip")))] == 1
    assert got[("provisioner_smoke_last_run_timestamp_seconds", ())] == 1796119200.0  # 2026-12-01T10:00:00Z
    # A skipped check has no figure, limit or ratio: no sample rather than a made-up zero.
    assert not [k for k in got if k[0] != "provisioner_smoke_status" and ("check", "torch.mlp") in k[1]]
    # One status per check, and nothing but the metrics the docs list.
    assert sum(k[0] == "provisioner_smoke_status" for k in got) == 4
    assert {k[0] for k in got} == set(metrics.SMOKE_METRICS)


def test_the_serving_figures_are_series_like_every_other_check():
    import json

    data = Path(__file__).parent / "data"
    raw = json.loads((data / "smoke_raw_baseline.json").read_text())
    raw["mode"] = "tuned"
    raw["results"] = {"serving": json.loads((data / "smoke_serving_runs.json").read_text())["tuned"]["serving"]}
    raw["cost"] = {"price_per_month": 146.0, "cloud_prices": {"c5.4xlarge": 0.68}}
    judged = smoke.evaluate(raw)
    got = samples(metrics.smoke_text(judged))
    level8 = next(lv for lv in raw["results"]["serving"]["levels"] if lv["connections"] == 8)
    assert got[("provisioner_smoke_figure", (("check", "serving.rps"), ("unit", "requests/s")))] == level8["requests_per_s"]
    assert got[("provisioner_smoke_figure", (("check", "serving.p99"), ("unit", "ms")))] == level8["p99_ms"]
    assert got[("provisioner_smoke_limit", (("check", "serving.p99"), ("unit", "ms")))] == 20.0
    assert got[("provisioner_smoke_status", (("check", "serving.errors"), ("status", "pass")))] == 1
    assert ("provisioner_smoke_figure", (("check", "serving.rps_c32"), ("unit", "requests/s"))) in got
    assert ("provisioner_smoke_figure", (("check", "cost.serving.c5.4xlarge"), ("unit", "$/1M predictions"))) in got
    assert {k[0] for k in got} == set(metrics.SMOKE_METRICS)  # no series of its own to document


def test_an_unknown_start_is_now():
    assert abs(metrics.started_seconds("") - __import__("time").time()) < 5


def test_written_atomically_beside_the_history(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path))
    path = metrics.write_smoke(report())
    assert path == smoke.history_dir("web1") / "provisioner_smoke.prom"
    assert path.read_text() == metrics.smoke_text(report())
    assert [p.name for p in path.parent.iterdir()] == ["provisioner_smoke.prom"], "no temporary file left"


def test_metrics_know_neither_ansible_nor_the_terminal():
    assert not knows("metrics", *ANSIBLE, *TERMINAL)


# ---------------------------------------------------------------- publishing


def run_of(playbook: str, facts: dict) -> RunResult:
    return RunResult(playbook, False, 0, {h: HostResult(h, ok=2) for h in facts}, facts, [], Path("/x"), 1.0)


@pytest.fixture
def engine_runs(monkeypatch, tmp_path):
    """Fake engine runs by playbook; records each call."""
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "hosts.yml"
    inv.write_text("all: {hosts: {web1: {}, web2: {}}}\n")
    calls: list[tuple[str, dict]] = []
    results: dict[str, RunResult] = {}

    def run_playbook(playbook, inventory, **kwargs):
        calls.append((playbook, kwargs))
        return results[playbook]

    monkeypatch.setattr(engine, "run_playbook", run_playbook)
    return inv, results, calls


def test_only_tuned_runs_are_published_and_each_note_says_where(engine_runs):
    inv, results, calls = engine_runs
    results["smoke_metrics.yml"] = run_of(
        "smoke_metrics.yml", {"web1": {"smoke_metrics_published": "/var/lib/prometheus/node-exporter/provisioner_smoke.prom"}}
    )
    run, notes = commands.publish_metrics(inv, [report("web1"), report("web2"), report("web3", mode="baseline")])
    assert run is results["smoke_metrics.yml"]
    (book, kwargs), = calls
    assert book == "smoke_metrics.yml" and kwargs["limit"] == "web1,web2"
    assert kwargs["extravars"] == {"smoke_metrics_files": {h: str(smoke.history_dir(h) / "provisioner_smoke.prom") for h in ("web1", "web2")}}
    assert notes[0].startswith("smoke metrics of web1: web1:/var/lib/prometheus/node-exporter/provisioner_smoke.prom")
    assert notes[1].startswith("smoke metrics of web2: no textfile directory on the host (role monitoring)")
    assert not (smoke.history_dir("web3") / "provisioner_smoke.prom").exists()


def test_nothing_to_publish_runs_nothing(engine_runs):
    inv, _, calls = engine_runs
    assert commands.publish_metrics(inv, [report(mode="baseline")]) == (None, ())
    assert calls == []


def test_smoke_publishes_and_a_failed_publish_decides_the_exit_code(engine_runs, monkeypatch):
    inv, results, calls = engine_runs
    monkeypatch.setattr(commands, "measure", lambda i, **kw: SmokeRun(run_of("smoke.yml", {"web1": {}}), [report(failing=False)]))
    results["smoke_metrics.yml"] = run_of("smoke_metrics.yml", {"web1": {}})
    results["smoke_metrics.yml"].hosts["web1"].unreachable = 1
    results["smoke_metrics.yml"].hosts["web1"].errors.append("web1: unreachable (gone)")
    result = commands.smoke(inv)
    assert [c[0] for c in calls] == ["smoke_metrics.yml"]
    assert result.exit_code == ExitCode.UNREACHABLE and "web1: unreachable (gone)" in result.errors
    assert any(m.startswith("smoke metrics of web1: ") for m in result.messages)


def test_up_publishes_after_its_smoke_test(engine_runs, monkeypatch):
    from provisioner.verify import CheckResult, VerifyResult

    inv, results, calls = engine_runs
    results["site.yml"] = run_of("site.yml", {"web1": {}})
    results["smoke_metrics.yml"] = run_of("smoke_metrics.yml", {"web1": {"smoke_metrics_published": "/d/provisioner_smoke.prom"}})
    monkeypatch.setattr(commands, "run_checks", lambda i, **kw: VerifyResult([CheckResult("web1", "t", "passed", role="common")]))
    monkeypatch.setattr(commands, "measure", lambda i, **kw: SmokeRun(run_of("smoke.yml", {"web1": {}}), [report(failing=False)]))
    result = commands.up(inv)
    assert [c[0] for c in calls] == ["site.yml", "smoke_metrics.yml"]
    assert result.exit_code == ExitCode.OK
    assert result.messages == (f"smoke metrics of web1: web1:/d/provisioner_smoke.prom (node_exporter's textfile collector); "
                               f"kept in {smoke.history_dir('web1') / 'provisioner_smoke.prom'}",)


# Both cases in one publish run (and one more, the same figures again): a host each.
PUBLISHED = {"deployed": True, "not-deployed": False}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    from playbook_cases import once

    def publish(tmp: Path) -> dict:
        hosts = {}
        for name, deployed in PUBLISHED.items():
            (tmp / name).mkdir()
            if deployed:
                (tmp / name / "node-exporter").mkdir()
            hosts[name] = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                           "monitoring_textfile_dir": str(tmp / name / "node-exporter")}
        inv = tmp / "hosts.yml"
        inv.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("PROVISIONER_STATE_DIR", str(tmp / "state"))
            run, notes = commands.publish_metrics(inv, [report(name) for name in PUBLISHED])
            again, _ = commands.publish_metrics(inv, [report(name) for name in PUBLISHED])
        assert run is not None and again is not None
        return {"dir": str(tmp), "exit_code": int(run.exit_code), "errors": list(run.errors),
                "failed": {h: r.failed + r.unreachable for h, r in run.hosts.items()},
                "notes": dict(zip(PUBLISHED, notes, strict=True)), "changed_again": {h: r.changed for h, r in again.hosts.items()}}

    return once(tmp_path_factory, "smoke-metrics-publish", publish)


def test_the_publish_run_succeeds(published):
    assert published["exit_code"] == ExitCode.OK, published["errors"]


@pytest.mark.parametrize("host", list(PUBLISHED))
def test_publish_playbook_copies_into_the_textfile_directory_only_where_it_exists(published, host):
    deployed = PUBLISHED[host]
    textfile = Path(published["dir"]) / host / "node-exporter"
    assert published["failed"][host] == 0, published["errors"]
    assert (textfile / "provisioner_smoke.prom").exists() == deployed
    note = published["notes"][host]
    assert note.startswith(f"smoke metrics of {host}: ")
    if deployed:
        assert samples((textfile / "provisioner_smoke.prom").read_text()) == samples(metrics.smoke_text(report(host)))
        assert f"{host}:{textfile}/provisioner_smoke.prom" in note
        assert published["changed_again"][host] == 0, "the same figures again change nothing"
    else:
        assert "no textfile directory" in note


def test_a_config_only_run_keeps_nothing_publishes_nothing_and_writes_no_default_report(engine_runs):
    inv, results, calls = engine_runs
    raw = json.loads((Path(__file__).parent / "data" / "smoke_raw_baseline.json").read_text())
    raw |= {"mode": "tuned", "results": {}}
    results["smoke.yml"] = run_of("smoke.yml", {"web1": {"smoke_result": raw}})
    result = commands.smoke(inv, config_only=True)
    (book, kwargs), = calls  # smoke.yml alone: no metrics run
    assert book == "smoke.yml" and kwargs["extravars"]["smoke_config_only"] is True
    assert kwargs["extravars"]["smoke_mode"] == "tuned"
    (judged,) = result.value.reports
    assert {c.group for c in judged.checks} <= {"host", "configuration"} and judged.checks
    assert result.value.html is None and not smoke.default_html().exists()
    assert not smoke.history_dir("web1").exists() or not list(smoke.history_dir("web1").glob("*.json"))


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"baseline": True}, "--config-only checks the tuned configuration and a --baseline run has none"),
        ({"extravars": {"smoke_cluster": True}}, "--config-only runs no workload and --cluster is one"),
        ({"profile": "full"}, "--config-only runs no workload, so --full sizes nothing"),
    ],
)
def test_config_only_with_a_workload_option_is_refused_before_any_run(engine_runs, kwargs, says):
    from provisioner.errors import BadInput

    inv, _, calls = engine_runs
    with pytest.raises(BadInput, match=says):
        commands.smoke(inv, config_only=True, **kwargs)
    assert calls == []
