"""The commands outside the CLI: one result type and JSON envelope, and `up`'s chain of steps
(apply -> reboot -> verify -> smoke) where the first step that fails decides the exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provisioner import commands, engine
from provisioner.cli import app
from provisioner.errors import BadInput, ExitCode
from provisioner.reboot import REASONS_FACT
from provisioner.result import SCHEMA, Result, first_failure, refused
from provisioner.runs import HostResult, RunResult
from provisioner.smoke import SmokeRun
from provisioner.verify import CheckResult, VerifyResult

runner = CliRunner()


def run_result(playbook: str, *, failed: int = 0, unreachable: int = 0, refused: int = 0, facts=None) -> RunResult:
    host = HostResult("web1", ok=3, failed=failed, unreachable=unreachable, refused=refused)
    if failed:
        host.errors.append(f"a task of {playbook}: failed")
    return RunResult(playbook, False, 2 if failed or unreachable else 0, {"web1": host}, facts or {"web1": {}}, [], Path("/x"), 1.0)


class Steps:
    """Fakes for the engine, the checks and the smoke test; records which steps ran."""

    def __init__(self, monkeypatch, tmp_path: Path, *, site=None, reboot=None, verify=None, smoke=None):
        self.ran: list[str] = []
        self.results = {"site.yml": site or run_result("site.yml"), "reboot.yml": reboot or run_result("reboot.yml")}
        self.verify = verify or VerifyResult([CheckResult("web1", "test_x", "passed", role="common")])
        self.smoke = smoke or SmokeRun(run_result("smoke.yml"), [])
        self.inventory = tmp_path / "hosts.yml"
        self.inventory.write_text("all: {hosts: {web1: {}}}\n")
        monkeypatch.setattr(engine, "run_playbook", self.run_playbook)
        monkeypatch.setattr(commands, "run_checks", self.run_checks)
        monkeypatch.setattr(commands, "measure", self.measure)

    def run_playbook(self, playbook, inventory, **kwargs):
        self.ran.append(playbook)
        return self.results[playbook]

    def run_checks(self, inventory, **kwargs):
        self.ran.append("verify")
        return self.verify

    def measure(self, inventory, **kwargs):
        self.ran.append("smoke")
        return self.smoke


def test_envelope_has_one_shape_for_every_command():
    result = Result("verify", VerifyResult([CheckResult("web1", "test_x", "failed", "boom", "common")]), ExitCode.HOST_FAILED)
    env = result.envelope()
    assert list(env) == ["schema", "command", "exit_code", "data", "messages", "errors"]
    assert env["schema"] == SCHEMA == 1 and env["command"] == "verify" and env["exit_code"] == 1
    assert env["data"]["hosts"]["web1"][0] == {"check": "test_x", "role": "common", "outcome": "failed", "message": "boom"}
    json.dumps(env)  # JSON-ready all the way down


def test_a_refusal_is_a_result_without_data():
    env = refused("up", BadInput("unknown tag(s) comon")).envelope()
    assert env == {
        "schema": 1, "command": "up", "exit_code": 2, "data": None, "messages": [], "errors": ["unknown tag(s) comon"]
    }


def test_result_is_frozen():
    result: Result[list[str]] = Result("lab list", [])
    with pytest.raises(AttributeError):
        result.exit_code = ExitCode.INTERNAL  # type: ignore[misc]


def test_first_failure_decides():
    assert first_failure([0, None, 0]) == ExitCode.OK
    assert first_failure([0, 3, 1]) == ExitCode.UNREACHABLE
    assert first_failure([None, 1, 2]) == ExitCode.HOST_FAILED


def test_up_runs_every_step_and_succeeds(monkeypatch, tmp_path):
    steps = Steps(monkeypatch, tmp_path)
    result = commands.up(steps.inventory)
    assert steps.ran == ["site.yml", "verify", "smoke"]
    assert result.exit_code == ExitCode.OK and result.data["exit_code"] == 0
    assert result.data["verify"]["exit_code"] == 0 and result.data["smoke"]["exit_code"] == 0


def test_up_stops_at_a_failed_apply(monkeypatch, tmp_path):
    steps = Steps(monkeypatch, tmp_path, site=run_result("site.yml", failed=1))
    result = commands.up(steps.inventory)
    assert steps.ran == ["site.yml"]
    assert result.exit_code == ExitCode.HOST_FAILED
    assert result.data["verify"] is None and result.data["smoke"] is None
    assert result.errors == ("web1: a task of site.yml: failed",)


def test_up_refused_input_keeps_exit_code_2(monkeypatch, tmp_path):
    steps = Steps(monkeypatch, tmp_path, site=run_result("site.yml", failed=1, refused=1))
    assert commands.up(steps.inventory).exit_code == ExitCode.BAD_INPUT
    assert steps.ran == ["site.yml"]


def test_up_exit_code_is_the_failed_verify(monkeypatch, tmp_path):
    failing = VerifyResult([CheckResult("web1", "test_x", "failed", "boom", "common")])
    steps = Steps(monkeypatch, tmp_path, verify=failing)
    result = commands.up(steps.inventory)
    assert steps.ran == ["site.yml", "verify"], "no smoke test on a host that failed its checks"
    assert result.exit_code == ExitCode.HOST_FAILED == result.data["exit_code"]


def test_up_exit_code_is_the_smoke_run_when_only_it_fails(monkeypatch, tmp_path):
    steps = Steps(monkeypatch, tmp_path, smoke=SmokeRun(run_result("smoke.yml", unreachable=1), []))
    result = commands.up(steps.inventory)
    assert steps.ran == ["site.yml", "verify", "smoke"]
    assert result.exit_code == ExitCode.UNREACHABLE


def test_up_with_tags_or_check_skips_the_smoke_test(monkeypatch, tmp_path):
    steps = Steps(monkeypatch, tmp_path)
    commands.up(steps.inventory, tags=["common"])
    assert steps.ran == ["site.yml", "verify"]
    steps.ran.clear()
    commands.up(steps.inventory, check=True)
    assert steps.ran == ["site.yml"]


def test_up_reboots_only_when_allowed_and_the_apply_passed(monkeypatch, tmp_path):
    facts = {"web1": {REASONS_FACT: ["hugepages: 1G pages are reserved at boot"]}}
    steps = Steps(monkeypatch, tmp_path, site=run_result("site.yml", facts=facts))
    pending = commands.up(steps.inventory, smoke_after=False)
    assert steps.ran == ["site.yml", "verify"]
    assert pending.messages == ("reboot pending on web1: hugepages: 1G pages are reserved at boot; run again with --reboot",)
    steps.ran.clear()
    steps.results["reboot.yml"] = run_result("reboot.yml", failed=1)
    result = commands.up(steps.inventory, reboot=True)
    assert steps.ran == ["site.yml", "reboot.yml"], "a failed reboot stops before verify"
    assert result.exit_code == ExitCode.HOST_FAILED
    assert result.messages[0].startswith("rebooted web1: ")


def test_verify_without_checks_is_bad_input(monkeypatch, tmp_path):
    steps = Steps(monkeypatch, tmp_path, verify=VerifyResult([]))
    result = commands.verify(steps.inventory)
    assert result.exit_code == ExitCode.BAD_INPUT
    assert "no checks ran" in result.errors[0]


def test_cli_prints_the_envelope_and_exits_with_its_code(monkeypatch, tmp_path):
    failing = VerifyResult([CheckResult("web1", "test_x", "failed", "boom", "common")])
    steps = Steps(monkeypatch, tmp_path, verify=failing)
    out = runner.invoke(app, ["up", "-i", str(steps.inventory), "--json"])
    assert out.exit_code == ExitCode.HOST_FAILED
    env = json.loads(out.stdout)
    assert env["command"] == "up" and env["exit_code"] == 1 and env["data"]["verify"]["exit_code"] == 1


def test_cli_errors_leave_by_one_path_with_json_too(tmp_path):
    out = runner.invoke(app, ["verify", "-i", str(tmp_path / "nope.yml"), "--json"])
    assert out.exit_code == ExitCode.BAD_INPUT
    env = json.loads(out.stdout)
    assert env["command"] == "verify" and env["data"] is None and "does not exist" in env["errors"][0]
    assert out.stderr.startswith("error: ") and len(out.stderr.strip().splitlines()) == 1


def test_bundle_builds_or_updates_the_lock_from_one_command(monkeypatch, tmp_path):
    from provisioner import bundle

    calls = []

    def build(dest, components, **kwargs):
        calls.append(("build", components, kwargs["lock_path"]))
        return bundle.BundleResult(path=Path(dest), files=["a.whl"], bytes=10, seconds=0.1, components=components)

    def generate(output, **kwargs):
        calls.append(("lock", output, kwargs["glibc"]))
        return bundle.parse_lock("schema: 1\ncomponents: {core: [numpy==2.4.6, scipy==1.16.0]}\n")

    monkeypatch.setattr(bundle, "build_wheelhouse", build)
    monkeypatch.setattr(bundle, "generate_lock", generate)
    out = runner.invoke(app, ["bundle", str(tmp_path / "wh"), "-c", "torch", "--json"])
    assert out.exit_code == 0, out.output
    env = json.loads(out.stdout)
    assert env["command"] == "bundle" and env["data"]["files"] == ["a.whl"]
    assert calls == [("build", ["torch"], bundle.DEFAULT_LOCK)]
    out = runner.invoke(app, ["bundle", "--update-lock", "--lock", str(tmp_path / "new.lock")])
    assert out.exit_code == 0, out.output
    assert calls[-1] == ("lock", tmp_path / "new.lock", bundle.DEFAULT_GLIBC)
    assert "core 2" in out.stdout
