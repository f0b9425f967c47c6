"""Fleets: rolling runs (--batch, --max-fail) sized and refused before any host is touched, forks
per batch, hosts a stopped roll never reached, and the per-host summary with failures first."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provisioner import engine, render
from provisioner.cli import app
from provisioner.errors import BadInput, ExitCode
from provisioner.runs import HostResult, RunResult

GIB = 2**30


@pytest.mark.parametrize(
    ("value", "fleet", "hosts"),
    [
        ("1", 4, 1),
        ("4", 4, 4),
        (" 3 ", 10, 3),
        ("25%", 4, 1),
        ("25%", 1000, 250),
        ("10%", 5, 1),
        ("100%", 7, 7),
        ("29%", 100, 29),
    ],
)
def test_a_batch_is_a_number_of_hosts_or_a_share_of_the_fleet(value, fleet, hosts):
    assert engine.parse_batch(value).hosts(fleet) == hosts


@pytest.mark.parametrize(
    ("value", "named", "fix"),
    [
        ("0", "--batch 0", "give 1 or more hosts"),
        ("0%", "--batch 0%", "give 1 or more hosts"),
        ("5", "--batch 5", "give 1 to 4"),
        ("101%", "--batch 101%", "from 1% to 100%"),
        ("two", "--batch 'two'", "e.g. --batch 10"),
        ("-1", "--batch '-1'", "e.g. --batch 10"),
        ("1.5", "--batch '1.5'", "e.g. --batch 10"),
        ("10%%", "--batch '10%%'", "e.g. --batch 10"),
        ("", "--batch ''", "e.g. --batch 10"),
    ],
)
def test_a_batch_of_no_hosts_more_than_the_fleet_or_malformed_is_refused(value, named, fix):
    with pytest.raises(BadInput) as caught:
        engine.parse_batch(value).hosts(4)
    message = str(caught.value)
    assert message.startswith(named) and fix in message and "\n" not in message


def test_the_failure_threshold_is_a_share_from_none_to_all():
    assert [engine.parse_max_fail(v) for v in ("0", "0%", "10%", "100")] == [0, 0, 10, 100]
    for bad in ("101%", "ten", "-5", "5.5%"):
        with pytest.raises(BadInput, match=r"^--max-fail .* from 0% to 100%"):
            engine.parse_max_fail(bad)


def test_forks_follow_the_batch_within_the_memory_bound():
    # One fork per host of a batch; memory still bounds it (4 GiB free: 20 forks).
    assert engine.forks_for(engine.parse_batch("10%").hosts(1000), available_memory=64 * GIB) == 100
    assert engine.forks_for(engine.parse_batch("10%").hosts(1000), available_memory=4 * GIB) == 20
    assert engine.forks_for(engine.parse_batch("1").hosts(8), available_memory=64 * GIB) == 1


@pytest.fixture
def fleet_inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  children:\n"
        "    web: {hosts: {web1: {ansible_host: 10.9.0.1}, web2: {ansible_host: 10.9.0.2}}}\n"
        "    db: {hosts: {db1: {ansible_host: 10.9.0.3}}}\n"
    )
    return inv


class Ran(Exception):
    pass


@pytest.fixture
def runner_call(monkeypatch):
    """ansible_runner.run replaced: records its keyword arguments and stops there."""
    import ansible_runner

    calls: list[dict] = []

    def fake_run(**kwargs):
        calls.append(kwargs)
        raise Ran

    monkeypatch.setattr(ansible_runner, "run", fake_run)
    monkeypatch.delenv(engine.FORKS_ENV, raising=False)
    return calls


def test_a_rolling_run_hands_site_yml_the_batch_as_a_host_count_and_forks_one_per_batch_host(
    fleet_inventory, runner_call, tmp_path, monkeypatch
):
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    with pytest.raises(Ran):
        engine.run_playbook("site.yml", fleet_inventory, limit="web", batch=engine.parse_batch("50%"), max_fail=0)
    (call,) = runner_call
    assert call["extravars"] == {engine.SERIAL_VAR: 1, engine.MAX_FAIL_VAR: 0}, "50% of the 2 hosts --limit web reaches"
    assert call["forks"] == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch": engine.Batch(4, False)}, "--batch 4: more hosts than the 3 this run reaches"),
        ({"batch": engine.Batch(3, False), "limit": "db"}, "--batch 3: more hosts than the 1 this run reaches"),
        ({"batch": engine.Batch(1, False), "limit": "nosuch"}, "--limit nosuch: nosuch matches no host"),
        ({"max_fail": 10}, "--max-fail 10% stops a rolling run: give --batch"),
    ],
)
def test_a_bad_rolling_run_is_refused_before_ansible_runs(fleet_inventory, runner_call, kwargs, message):
    with pytest.raises(BadInput, match="^" + message):
        engine.run_playbook("site.yml", fleet_inventory, **kwargs)
    assert runner_call == [], "no host may be touched"


def test_the_cli_refuses_a_bad_batch_with_one_line_and_exit_2(fleet_inventory, runner_call):
    result = CliRunner().invoke(app, ["up", "-i", str(fleet_inventory), "--batch", "0"])
    assert result.exit_code == ExitCode.BAD_INPUT
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: --batch 0: a batch of no hosts never ends; give 1 or more hosts")
    result = CliRunner().invoke(app, ["up", "-i", str(fleet_inventory), "--batch", "9", "--json"])
    assert result.exit_code == ExitCode.BAD_INPUT and '"data": null' in result.stdout
    assert runner_call == []


def events_of_a_stopped_roll() -> list[dict]:
    """site.yml rolled one host at a time: all three pass the input play, web1 (the first batch)
    fails in the first role play, and no later batch starts."""

    def start(host, play, task):
        return {"event": "runner_on_start", "event_data": {"host": host, "play_uuid": play, "task": task}}

    def ok(host, play, task):
        return {"event": "runner_on_ok", "event_data": {"host": host, "play_uuid": play, "task": task, "res": {}}}

    events = [{"event": "playbook_on_play_start", "event_data": {"play_uuid": "p0"}}]
    for h in ("web1", "web2", "db1"):
        events += [start(h, "p0", "Derive the plan"), ok(h, "p0", "Derive the plan")]
    events += [
        {"event": "playbook_on_play_start", "event_data": {"play_uuid": "p1"}},
        start("web1", "p1", "Read dpkg's database"),
        {
            "event": "runner_on_failed",
            "event_data": {"host": "web1", "play_uuid": "p1", "task": "Read dpkg's database", "res": {"msg": "denied"}},
        },
    ]
    return events


def collect(events: list[dict], batch: dict | None = None) -> RunResult:
    c = engine._EventCollector(None, frozenset({0}))
    for e in events:
        c.handle(e)
    c.mark_not_reached()
    rc = 2 if any(h.failed for h in c.hosts.values()) else 0
    return RunResult("site.yml", False, rc, c.hosts, c.facts, c.changes, Path("/tmp"), 1.0, batch=batch or {})


def test_hosts_a_stopped_roll_never_reached_are_named_and_fail_the_run():
    run = collect(events_of_a_stopped_roll())
    assert {h: r.status for h, r in run.hosts.items()} == {"web1": "failed", "web2": "not reached", "db1": "not reached"}
    assert run.exit_code == ExitCode.HOST_FAILED
    assert run.errors == ["web1: Read dpkg's database: denied"]


def test_a_run_that_ends_normally_reaches_every_host():
    events = events_of_a_stopped_roll()[:-2]  # the input play, and the first role play's start
    for h in ("web1", "web2", "db1"):
        events += [
            {"event": "runner_on_start", "event_data": {"host": h, "play_uuid": "p1", "task": "t"}},
            {"event": "runner_on_ok", "event_data": {"host": h, "play_uuid": "p1", "task": "t", "res": {}}},
        ]
    run = collect(events)
    assert {h: r.status for h, r in run.hosts.items()} == dict.fromkeys(("web1", "web2", "db1"), "ok")
    assert run.exit_code == ExitCode.OK


def summary_run() -> RunResult:
    hosts = {
        "a-ok": HostResult("a-ok", ok=5),
        "b-changed": HostResult("b-changed", ok=4, changed=1),
        "c-down": HostResult("c-down", unreachable=1, errors=["c-down: unreachable (no route); check it"]),
        "d-failed": HostResult("d-failed", ok=2, failed=1, errors=["Install: boom"]),
        "e-later": HostResult("e-later", ok=1, not_reached=True),
    }
    return RunResult("site.yml", False, 2, hosts, {}, [], Path("/x"), 3.0, batch={"fleet": 5, "hosts_per_batch": 2})


def test_the_summary_table_counts_the_hosts_in_its_title_and_shows_failures_first(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(render, "console", render.make_console(file=out, width=200))
    render.run_summary(summary_run())
    text = out.getvalue()
    assert "site.yml on 5 hosts: 1 unreachable, 1 failed, 1 not reached, 1 changed, 1 ok (batches of 2)" in text
    rows = [ln.split()[1] for ln in text.splitlines() if ln.startswith("│")]
    assert rows == ["c-down", "d-failed", "e-later", "b-changed", "a-ok"]


def test_the_json_has_every_host_failures_first_with_a_summary_and_the_batch():
    data = summary_run().to_dict()
    assert list(data["hosts"]) == ["c-down", "d-failed", "e-later", "b-changed", "a-ok"]
    assert data["hosts"]["e-later"]["status"] == "not reached"
    assert data["summary"] == {
        "hosts": 5,
        "unreachable": 1,
        "failed": 1,
        "refused": 0,
        "not reached": 1,
        "changed": 1,
        "ok": 1,
    }
    assert data["batch"] == {"fleet": 5, "hosts_per_batch": 2}
    assert summary_run().errors == ["c-down: unreachable (no route); check it", "d-failed: Install: boom"]


def test_a_single_host_title_says_host():
    run = RunResult("facts.yml", False, 0, {"web1": HostResult("web1", ok=2)}, {}, [], Path("/x"), 1.0)
    assert render.summary_title(run) == "facts.yml on 1 host: 1 ok"


def test_the_live_table_of_a_big_fleet_shows_its_failures_first_and_counts_the_rest():
    hosts = {f"h{i:03}": HostResult(f"h{i:03}", ok=i) for i in range(100)}
    hosts["h099"].failed = 1
    out = io.StringIO()
    render.make_console(file=out, width=200).print(render._progress_table(hosts))
    text = out.getvalue()
    assert "100 hosts, 1 failing, 20 shown" in text
    rows = [ln.split()[1] for ln in text.splitlines() if ln.startswith("│")]
    assert rows[0] == "h099" and len(rows) == render.PROGRESS_ROWS


def test_a_big_fleet_writes_only_the_events_that_tell_something():
    def event(kind, **res):
        return {"event": kind, "event_data": {"host": "h1", "play_uuid": "p0", "task": "t", "res": res}}

    routine = [event("runner_on_start"), event("runner_on_ok"), event("runner_on_skipped")]
    telling = [event("runner_on_ok", changed=True), event("runner_on_failed", msg="x"), event("runner_on_unreachable", msg="y")]
    small = engine._EventCollector(None)
    assert all(small.handle(e) for e in routine + telling)
    big = engine._EventCollector(None, keep_routine=False)
    assert [big.handle(e) for e in routine + telling] == [False, False, False, True, True, True]
    assert big.hosts["h1"].to_dict() | {"errors": []} == small.hosts["h1"].to_dict() | {"errors": []}, "counted all the same"
