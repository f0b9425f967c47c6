"""`provisioner undo` and its reboot: the restore, then (with --reboot, after a restore that
succeeded) one reboot of each host whose restore needs it, never this machine; without
--reboot the summary says which reboot is pending and how to do it."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from provisioner import commands, engine
from provisioner.cli import app
from provisioner.errors import ExitCode
from provisioner.reboot import REASONS_FACT
from provisioner.runs import HostResult, RunResult

runner = CliRunner()
REASON = "hugepages: undo removed hugepagesz=1G hugepages=1 from the kernel command line"


def run_result(playbook: str, hosts=("web1",), *, failed=(), check=False, reasons=None) -> RunResult:
    results = {}
    for h in hosts:
        results[h] = HostResult(h, ok=3, changed=1, failed=int(h in failed))
        if h in failed:
            results[h].errors.append(f"a task of {playbook}: failed")
    facts = {h: {REASONS_FACT: list((reasons or {}).get(h, []))} for h in hosts}
    return RunResult(playbook, check, 2 if failed else 0, results, facts, [], Path("/x"), 1.0)


class Runs:
    """A fake engine: the playbooks undo ran, with their limits."""

    def __init__(self, monkeypatch, tmp_path: Path, undo: RunResult, reboot: RunResult | None = None, hostvars=None):
        self.ran: list[tuple[str, str | None]] = []
        self.results = {"undo.yml": undo, "reboot.yml": reboot or run_result("reboot.yml")}
        self.inventory = tmp_path / "hosts.yml"
        self.inventory.write_text("all: {hosts: {web1: {}}}\n")
        undo.hostvars = hostvars or {h: {"ansible_host": "203.0.113.11"} for h in undo.hosts}
        monkeypatch.setattr(engine, "run_playbook", self.run_playbook)

    def run_playbook(self, playbook, inventory, **kwargs):
        self.ran.append((playbook, kwargs.get("limit")))
        self.tags = kwargs.get("tags", ())
        return self.results[playbook]


def test_without_reboot_the_summary_says_which_reboot_is_pending(monkeypatch, tmp_path):
    runs = Runs(monkeypatch, tmp_path, run_result("undo.yml", reasons={"web1": [REASON, REASON]}))
    result = commands.undo(runs.inventory)
    assert runs.ran == [("undo.yml", None)], "no reboot without --reboot"
    assert result.exit_code == ExitCode.OK
    assert result.messages == (f"reboot pending on web1: {REASON}; run provisioner undo --reboot (or reboot it)",)
    assert result.data["reboot"] == {"reboot": {}, "pending": {"web1": [REASON]}}
    assert result.data["rebooted"] is None and result.data["exit_code"] == 0
    assert result.data["hosts"]["web1"]["changed"] == 1, "the restore's own run stays the data's body"


def test_reboot_reboots_only_the_hosts_whose_restore_needs_it_once_each(monkeypatch, tmp_path):
    undo = run_result("undo.yml", ("web1", "web2", "web3"), reasons={"web1": [REASON], "web3": [REASON, REASON]})
    runs = Runs(monkeypatch, tmp_path, undo, reboot=run_result("reboot.yml", ("web1", "web3")))
    result = commands.undo(runs.inventory, reboot=True)
    assert runs.ran == [("undo.yml", None), ("reboot.yml", "web1,web3")]
    assert result.exit_code == ExitCode.OK
    assert result.messages == (f"rebooted web1: {REASON}", f"rebooted web3: {REASON}")
    assert result.data["reboot"]["reboot"] == {"web1": [REASON], "web3": [REASON]}
    assert result.data["rebooted"]["playbook"] == "reboot.yml"


def test_reboot_never_reboots_this_machine(monkeypatch, tmp_path):
    undo = run_result("undo.yml", ("localhost",), reasons={"localhost": [REASON]})
    runs = Runs(monkeypatch, tmp_path, undo, hostvars={"localhost": {"ansible_connection": "local"}})
    result = commands.undo(runs.inventory, reboot=True)
    assert runs.ran == [("undo.yml", None)]
    assert result.messages == (f"reboot pending on localhost: {REASON}; reboot it yourself (this machine is never rebooted)",)


def test_nothing_to_reboot_runs_no_reboot(monkeypatch, tmp_path):
    runs = Runs(monkeypatch, tmp_path, run_result("undo.yml"))
    result = commands.undo(runs.inventory, reboot=True)
    assert runs.ran == [("undo.yml", None)]
    assert result.messages == () and result.data["rebooted"] is None


def test_a_failed_restore_or_a_check_run_reboots_nothing(monkeypatch, tmp_path):
    failed = run_result("undo.yml", ("web1", "web2"), failed=("web2",), reasons={"web1": [REASON]})
    runs = Runs(monkeypatch, tmp_path, failed)
    result = commands.undo(runs.inventory, reboot=True)
    assert runs.ran == [("undo.yml", None)], "a restore that failed somewhere reboots no host"
    assert result.exit_code == ExitCode.HOST_FAILED
    assert result.errors == ("web2: a task of undo.yml: failed",)
    checked = Runs(monkeypatch, tmp_path, run_result("undo.yml", check=True, reasons={"web1": [REASON]}))
    result = commands.undo(checked.inventory, reboot=True, check=True)
    assert checked.ran == [("undo.yml", None)]
    assert result.messages == (f"reboot pending on web1: {REASON}; run provisioner undo --reboot (or reboot it)",)


def test_a_failed_reboot_decides_the_exit_code(monkeypatch, tmp_path):
    undo = run_result("undo.yml", reasons={"web1": [REASON]})
    runs = Runs(monkeypatch, tmp_path, undo, reboot=run_result("reboot.yml", failed=("web1",)))
    result = commands.undo(runs.inventory, reboot=True)
    assert result.exit_code == ExitCode.HOST_FAILED == result.data["exit_code"]
    assert result.errors == ("web1: a task of reboot.yml: failed",)


def test_cli_undo_reboot_passes_the_option_and_prints_the_envelope(monkeypatch, tmp_path):
    runs = Runs(monkeypatch, tmp_path, run_result("undo.yml", reasons={"web1": [REASON]}))
    out = runner.invoke(app, ["undo", "-i", str(runs.inventory), "--reboot", "--json"])
    assert out.exit_code == 0, out.output
    env = json.loads(out.stdout)
    assert env["command"] == "undo" and env["messages"] == [f"rebooted web1: {REASON}"]
    assert runs.ran == [("undo.yml", None), ("reboot.yml", "web1")]


def test_cli_undo_without_reboot_shows_the_pending_reboot_after_its_summary(monkeypatch, tmp_path):
    runs = Runs(monkeypatch, tmp_path, run_result("undo.yml", reasons={"web1": [REASON]}))
    out = runner.invoke(app, ["undo", "-i", str(runs.inventory)])
    assert out.exit_code == 0, out.output
    assert "reboot pending on web1" in out.output and "provisioner undo --reboot" in out.output
    assert out.output.index("web1") < out.output.index("reboot pending on web1"), "the summary comes first"


def test_cli_undo_reboot_refuses_bad_input_in_one_line(tmp_path):
    out = runner.invoke(app, ["undo", "-i", str(tmp_path / "nope.yml"), "--reboot"])
    assert out.exit_code == ExitCode.BAD_INPUT
    assert out.stderr.startswith("error: ") and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "nope.yml does not exist" in out.stderr
    out = runner.invoke(app, ["undo", "--reboot=now"])
    assert out.exit_code == ExitCode.BAD_INPUT
    assert "does not take a value" in out.output


def test_up_check_reboot_names_the_run_that_would_reboot_not_this_machine(monkeypatch, tmp_path):
    """up --check --reboot reboots nothing; the pending line tells to run again, since the host
    is remote (it used to say this machine is never rebooted)."""
    site = run_result("site.yml", check=True, reasons={"web1": [REASON]})
    runs = Runs(monkeypatch, tmp_path, site)
    runs.results["site.yml"] = site
    result = commands.up(runs.inventory, check=True, reboot=True, tags=["hugepages"])
    assert runs.ran == [("site.yml", None)]
    assert result.messages == (f"reboot pending on web1: {REASON}; run again with --reboot",)


def test_tags_select_whole_roles_to_undo_in_undo_yml(monkeypatch, tmp_path):
    assert commands.undo_roles()[0] == "smoke" and commands.undo_roles()[-1] == "common"
    runs = Runs(monkeypatch, tmp_path, run_result("undo.yml"))
    commands.undo(runs.inventory)
    assert runs.tags == (), "no --tags: every role"
    # A phase tag selects its role (a role's undo is whole), in undo.yml's order.
    commands.undo(runs.inventory, tags=["cpu_tuning", "common_configure", "hugepages"])
    assert runs.tags == ("hugepages", "cpu_tuning", "common")
    commands.undo(runs.inventory, skip_tags=["serving", "ray", "monitoring", "smoke"])
    assert runs.tags == ("thread_env", "mlstack", "allocator", "hugepages", "cpu_tuning", "storage", "common")


def test_undo_tags_that_select_nothing_or_are_unknown_are_refused_before_any_run(monkeypatch, tmp_path):
    runs = Runs(monkeypatch, tmp_path, run_result("undo.yml"))
    out = runner.invoke(app, ["undo", "-i", str(runs.inventory), "--tags", "hugepage"])
    assert out.exit_code == ExitCode.BAD_INPUT and "unknown tag(s) hugepage: use one of" in out.output
    out = runner.invoke(app, ["undo", "-i", str(runs.inventory), "--tags", "storage", "--skip-tags", "storage"])
    assert out.exit_code == ExitCode.BAD_INPUT
    assert "--tags/--skip-tags leave no role to undo: name a role (e.g. --tags hugepages) or drop them" in out.output
    assert runs.ran == []
    out = runner.invoke(app, ["undo", "-i", str(runs.inventory), "-t", "storage,hugepages"])
    assert out.exit_code == 0, out.output
    assert runs.ran == [("undo.yml", None)] and runs.tags == ("hugepages", "storage")
