"""`provisioner status`: the read-only playbook that ships the status script, the command's exit
codes (1 drift, 2 never provisioned, 3 unreachable), failures first, and the JSON envelope.

The playbook runs for real through ansible-playbook on this machine (local connection) with a
stand-in script whose output is the status script's JSON."""

from __future__ import annotations

import io
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from provisioner import commands, engine, paths, render
from provisioner.cli import app
from provisioner.errors import ExitCode
from provisioner.runs import HostResult, RunResult

runner = CliRunner()

SETTINGS: list[dict[str, Any]] = [
    {"role": "cpu_tuning", "name": "swappiness", "probe": "sysctl", "expected": "10", "live": "10", "state": "ok", "reason": ""},
    {"role": "cpu_tuning", "name": "tuned profile", "probe": "tuned", "expected": "provisioner", "live": "balanced",
     "state": "drifted", "reason": "profile directory /etc/tuned/provisioner is gone"},
    {"role": "cpu_tuning", "name": "governor", "probe": "governor", "expected": "performance", "live": None,
     "state": "not applicable", "reason": "not applicable: no cpufreq driver"},
    {"role": "thread_env", "name": "OMP_NUM_THREADS in a login shell of ml", "probe": "login_env", "expected": "2",
     "live": "64", "state": "drifted", "reason": ""},
]


def status_json(settings=SETTINGS, host="web1") -> dict:
    drifted = sum(s["state"] == "drifted" for s in settings)
    return {"schema": 1, "host": host, "seconds": 0.8, "settings": settings, "drifted": drifted}


def run_of(facts: dict, **host_counts) -> RunResult:
    hosts = {h: HostResult(h, ok=3, **host_counts) for h in facts}
    return RunResult("status.yml", False, 0, hosts, facts, [], Path("/x"), 1.5)


class FakeEngine:
    """Called with a result: engine.run_playbook returns it from then on, and the inventory (a
    real file) comes back; calls holds (playbook, keyword arguments) of each run."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, inventory: Path) -> None:
        self.monkeypatch = monkeypatch
        self.inventory = inventory
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, result: RunResult) -> Path:
        def run_playbook(playbook: str, inv: Path, **kwargs: Any) -> RunResult:
            self.calls.append((playbook, kwargs))
            return result

        self.monkeypatch.setattr(engine, "run_playbook", run_playbook)
        return self.inventory


@pytest.fixture
def fake_engine(monkeypatch, tmp_path) -> FakeEngine:
    """engine.run_playbook replaced by a given result; the inventory a real file."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {hosts: {web1: {}}}\n")
    return FakeEngine(monkeypatch, inventory)


def test_drift_is_exit_1_with_drifted_settings_first(fake_engine):
    inv = fake_engine(run_of({"web1": {commands.STATUS_FACT: status_json()}}))
    result = commands.status(inv, limit="web1")
    assert fake_engine.calls == [("status.yml", {"limit": "web1"})]
    assert result.exit_code == ExitCode.HOST_FAILED
    host = result.value.hosts["web1"]
    assert [s["state"] for s in host.settings] == ["drifted", "drifted", "ok", "not applicable"]
    assert [s["name"] for s in host.drifted] == ["tuned profile", "OMP_NUM_THREADS in a login shell of ml"]
    assert result.messages == (
        "web1: 2 setting(s) drifted; repair with: provisioner up --limit web1 --tags cpu_tuning,thread_env",
    )


FOREIGN = dict(
    SETTINGS[3],
    source={"file": "/etc/profile.d/zz-drift.sh", "line": 1, "managed_by_provisioner": False},
    repair="set by /etc/profile.d/zz-drift.sh line 1, not by provisioner: remove or change that line; "
    "`provisioner up` cannot repair it",
)


def test_a_value_set_by_a_file_provisioner_does_not_own_is_named_not_sent_to_up(fake_engine):
    """The status script found the file that sets the drifted value: `provisioner up` would not
    change it (a user's /etc/profile.d/zz-drift.sh), so the note names the file and the line,
    and the run it proposes repairs only what it can."""
    settings = [SETTINGS[0], SETTINGS[1], FOREIGN]
    result = commands.status(fake_engine(run_of({"web1": {commands.STATUS_FACT: status_json(settings)}})))
    assert result.exit_code == ExitCode.HOST_FAILED
    assert result.messages == (
        "web1: 1 setting(s) drifted; repair with: provisioner up --limit web1 --tags cpu_tuning",
        "web1: OMP_NUM_THREADS in a login shell of ml is set by /etc/profile.d/zz-drift.sh line 1, not by provisioner: "
        "remove or change that line; `provisioner up` cannot repair it",
    )
    only = commands.status(fake_engine(run_of({"web1": {commands.STATUS_FACT: status_json([FOREIGN])}})))
    assert len(only.messages) == 1 and "repair with" not in only.messages[0] and "zz-drift.sh line 1" in only.messages[0]
    assert only.data["hosts"]["web1"]["settings"][0]["source"]["file"] == "/etc/profile.d/zz-drift.sh"


def test_a_clean_host_is_exit_0(fake_engine):
    clean = [dict(s, state="ok", live=s["expected"]) for s in SETTINGS]
    inv = fake_engine(run_of({"web1": {commands.STATUS_FACT: status_json(clean)}}))
    result = commands.status(inv)
    assert result.exit_code == ExitCode.OK and result.messages == ()
    assert result.data["hosts"]["web1"]["drifted"] == 0


def test_not_applicable_and_unknown_states_are_not_drift(fake_engine):
    settings = [dict(SETTINGS[2]), dict(SETTINGS[0], state="reboot pending")]
    inv = fake_engine(run_of({"web1": {commands.STATUS_FACT: status_json(settings)}}))
    assert commands.status(inv).exit_code == ExitCode.OK


def test_a_host_never_provisioned_is_bad_input(fake_engine):
    refused = run_of({"web1": {}}, failed=1, refused=1)
    refused.hosts["web1"].errors.append("no expected state at /etc/provisioner/expected on web1: ... run provisioner up first")
    result = commands.status(fake_engine(refused))
    assert result.exit_code == ExitCode.BAD_INPUT
    assert result.value.hosts == {} and "provisioner up" in result.errors[0]


def test_unreachable_wins_over_drift(fake_engine):
    run = run_of({"web1": {commands.STATUS_FACT: status_json()}, "web2": {}})
    run.hosts["web2"].unreachable = 1
    result = commands.status(fake_engine(run))
    assert result.exit_code == ExitCode.UNREACHABLE
    assert set(result.value.hosts) == {"web1"}, "the reachable host's settings are still shown"


def test_cli_prints_the_envelope_and_exits_with_its_code(fake_engine):
    inv = fake_engine(run_of({"web1": {commands.STATUS_FACT: status_json()}}))
    out = runner.invoke(app, ["status", "-i", str(inv), "--json"])
    assert out.exit_code == ExitCode.HOST_FAILED
    env = json.loads(out.stdout)
    assert list(env) == ["schema", "command", "exit_code", "data", "messages", "errors"]
    assert env["command"] == "status" and env["exit_code"] == 1 and env["data"]["exit_code"] == 1
    host = env["data"]["hosts"]["web1"]
    assert host["drifted"] == 2 and host["settings"][0]["name"] == "tuned profile"
    assert env["data"]["run"]["playbook"] == "status.yml"


def test_the_table_names_each_drifted_setting_with_both_values(monkeypatch, fake_engine):
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    monkeypatch.setattr(render, "console", render.make_console(file=out))
    result = commands.status(fake_engine(run_of({"web1": {commands.STATUS_FACT: status_json()}})))
    render.status(result.value)
    lines = out.getvalue().splitlines()
    assert "web1: status (2 drifted, 0.8 s)" in lines[0]
    rows = [ln for ln in lines if "│" in ln and "role" not in ln]
    assert "tuned profile" in rows[0] and "provisioner" in rows[0] and "balanced" in rows[0] and "drifted" in rows[0]
    assert "OMP_NUM_THREADS" in rows[1] and " 2 " in rows[1] and "64" in rows[1]
    assert "not applicable" in rows[-1] and "no cpufreq driver" in rows[-1]


def test_the_table_says_what_repairs_a_value_a_foreign_file_sets(monkeypatch, fake_engine):
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    monkeypatch.setattr(render, "console", render.make_console(file=out, width=300))
    result = commands.status(fake_engine(run_of({"web1": {commands.STATUS_FACT: status_json([FOREIGN])}})))
    render.status(result.value)
    text = out.getvalue()
    assert "OMP_NUM_THREADS" in text and "set by /etc/profile.d/zz-drift.sh line 1, not by provisioner" in text
    assert "`provisioner up` cannot repair it" in text


# ---------------------------------------------------------------- the playbook, for real


def test_status_playbook_is_one_read_only_task_per_host():
    book = paths.PLAYBOOKS / "status.yml"
    # The script's refusal (no expected state: never provisioned) is bad input.
    assert engine.input_check_plays(book) == {0}
    plays = yaml.safe_load(book.read_text())
    assert all(p["gather_facts"] is False for p in plays), "status is fast: no fact gathering"
    modules = [[next(k for k in t if k.startswith(("ansible.builtin.", "provisioner_"))) for t in p["tasks"]] for p in plays]
    # One task reaches the host (the zipapp is built on the control node, the refusal is a fail
    # task: it runs there too); the rest runs on the control node.
    assert modules == [
        ["provisioner_zipapp", "ansible.builtin.script", "ansible.builtin.fail"],
        ["ansible.builtin.assert", "ansible.builtin.set_fact"],
    ]
    build, script = plays[0]["tasks"][:2]
    assert script["changed_when"] is False and script["check_mode"] is False and build["check_mode"] is False
    # The script the playbook ships is the package role shared carries (and role monitoring installs).
    assert plays[0]["vars"]["_status"]["package"].endswith("/../roles/shared/files/provisioner_status")
    assert (paths.ROLES / "shared" / "files" / "provisioner_status" / "__main__.py").is_file()


@pytest.fixture
def local(tmp_path, monkeypatch):
    """This machine as an inventory, a state dir of the test's own, and a stand-in status
    script under tmp_path (it prints STATUS_OUT and exits with STATUS_RC)."""
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        yaml.safe_dump({"all": {"hosts": {"box": {"ansible_connection": "local",
                                                  "ansible_python_interpreter": "{{ ansible_playbook_python }}"}}}})
    )
    (tmp_path / "expected").mkdir()

    def with_script(out: str, rc: int, stderr: str = "") -> dict:
        package = tmp_path / "standin"
        package.mkdir(exist_ok=True)
        (package / "__main__.py").write_text(textwrap.dedent(f"""\
            import sys
            assert sys.argv[1:] == ["--json", "--expected-dir", {str(tmp_path / 'expected')!r},
                                    "--plan", {str(tmp_path / 'plan.json')!r}], sys.argv
            sys.stdout.write({out!r})
            sys.stderr.write({stderr!r})
            sys.exit({rc})
            """))
        status = {"expected_dir": str(tmp_path / "expected"), "plan_file": str(tmp_path / "plan.json"), "package": str(package)}
        return {"_status": status}

    return inv, with_script


def status_via_playbook(inv: Path, extravars: dict, monkeypatch) -> commands.Result:
    real = engine.run_playbook
    monkeypatch.setattr(engine, "run_playbook", lambda book, i, **kw: real(book, i, extravars=extravars, **kw))
    return commands.status(inv)


def test_playbook_runs_the_script_and_drift_is_not_a_task_failure(local, monkeypatch):
    inv, with_script = local
    result = status_via_playbook(inv, with_script(json.dumps(status_json(host="box")), 1), monkeypatch)
    assert result.exit_code == ExitCode.HOST_FAILED, result.errors
    assert result.value.run.exit_code == ExitCode.OK and result.value.run.hosts["box"].changed == 0
    assert [s["name"] for s in result.value.hosts["box"].drifted] == ["tuned profile", "OMP_NUM_THREADS in a login shell of ml"]


def test_playbook_reports_a_script_that_stopped_without_a_result(local, monkeypatch):
    inv, with_script = local
    extravars = with_script("", 1, "Traceback (most recent call last):\nKeyError: 'probe'\n")
    result = status_via_playbook(inv, extravars, monkeypatch)
    assert result.exit_code == ExitCode.HOST_FAILED and result.value.hosts == {}
    assert "the status script stopped without a result (exit 1): KeyError: 'probe'" in result.errors[0]


def real_script(tmp_path: Path, expected: dict | None) -> dict:
    """The status script role shared ships, pointed at an expected directory under tmp_path."""
    directory = tmp_path / "real-expected"
    if expected is not None:
        directory.mkdir()
        (directory / "cpu_tuning.json").write_text(json.dumps(expected))
    package = str(paths.ROLES / "shared" / "files" / "provisioner_status")
    return {"_status": {"expected_dir": str(directory), "plan_file": str(tmp_path / "plan.json"), "package": package}}


def test_the_real_script_refuses_a_host_never_provisioned(local, monkeypatch, tmp_path):
    """One line with the script's own reason and the run that fixes it (over SSH the script's
    stderr is lost to the terminal Ansible opens: the reason travels on stdout)."""
    inv, _ = local
    result = status_via_playbook(inv, real_script(tmp_path, None), monkeypatch)
    assert result.exit_code == ExitCode.BAD_INPUT, result.errors
    assert result.value.run.hosts["box"].refused == 1 and result.value.hosts == {}
    assert result.errors == (
        f"box: Refuse a host with nothing to compare: never provisioned: no expected state in "
        f"{tmp_path / 'real-expected'} (the host was reached; nothing was changed); provision it first: "
        f"provisioner up -i {inv} --limit box",
    )


def test_the_real_script_refuses_an_unreadable_declaration_naming_it(local, monkeypatch, tmp_path):
    inv, _ = local
    extravars = real_script(tmp_path, {"schema": 1, "role": "cpu_tuning", "checks": []})
    (tmp_path / "real-expected" / "cpu_tuning.json").write_text("{not json")
    result = status_via_playbook(inv, extravars, monkeypatch)
    assert result.exit_code == ExitCode.BAD_INPUT, result.errors
    (error,) = result.errors
    assert f"cannot read {tmp_path / 'real-expected' / 'cpu_tuning.json'}: " in error
    assert error.endswith(f"(the host was reached; nothing was changed); write it again: provisioner up -i {inv} --limit box")


@pytest.mark.parametrize("rc", [2])
def test_playbook_reports_a_script_that_failed_without_its_json(local, monkeypatch, rc):
    """An end the script did not choose (argparse's usage error, no python3) is a failure on
    the host, named with the last line it wrote, not a refusal."""
    inv, with_script = local
    result = status_via_playbook(inv, with_script("", rc, "usage: provisioner-status [-h]\nerror: no\n"), monkeypatch)
    assert result.exit_code == ExitCode.HOST_FAILED and result.value.run.hosts["box"].refused == 0
    assert f"the status script stopped without a result (exit {rc}): error: no" in result.errors[0]


def test_the_real_script_names_a_drifted_setting_with_both_values(local, monkeypatch, tmp_path):
    """A sysctl the roles would persist, on this machine where no sysctl.d file sets it so."""
    inv, _ = local
    check = {"name": "a sysctl no file sets", "probe": "sysctl", "key": "vm.provisioner_test_unset", "expected": "10"}
    result = status_via_playbook(inv, real_script(tmp_path, {"schema": 1, "role": "cpu_tuning", "checks": [check]}), monkeypatch)
    assert result.exit_code == ExitCode.HOST_FAILED, result.errors
    (setting,) = result.value.hosts["box"].drifted
    assert setting["expected"] == "10" and setting["live"] and "vm.provisioner_test_unset" in setting["reason"], setting


def test_playbook_works_in_check_mode(local, monkeypatch):
    inv, with_script = local
    clean = status_json([dict(SETTINGS[0])], host="box")
    run = engine.run_playbook("status.yml", inv, check=True, extravars=with_script(json.dumps(clean), 0))
    assert run.exit_code == ExitCode.OK, run.errors
    assert run.facts["box"][commands.STATUS_FACT] == clean
