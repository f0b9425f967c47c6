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


# --------------------------------------------------------------------------
# role shared's packages undo (files/provisioner_packages_undo.py): what it purges and keeps
# --------------------------------------------------------------------------

def _packages_undo():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "provisioner_packages_undo", Path(__file__).resolve().parents[2] / "roles/shared/files/provisioner_packages_undo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PKG = _packages_undo()
RECORD = {"role": "packages", "schema": 1, "provisioned_before": False,
          "before": {"installed": ["bash", "python3"], "config_files": ["tuned"]},
          "added": {"cpu_tuning": ["tuned", "python3-dbus", "bash", "gone"], "common": ["wrk"]},
          "removed": {}, "users_added": {"monitoring": ["prometheus"]}, "groups_added": {"monitoring": ["prometheus"]}}


class Apt:
    """The host's answers, as apt-get, apt-cache, dpkg-query, getent, ps, userdel, groupdel give
    them; every command is kept."""

    def __init__(self, installed, *, purge_takes=(), depends="", passwd="", group="", busy=()):
        self.installed, self.purge_takes, self.depends = set(installed), set(purge_takes), depends
        self.passwd, self.group, self.busy, self.ran = passwd, group, set(busy), []

    def __call__(self, argv):
        argv = list(argv)
        self.ran.append(argv)
        if argv[0] == "dpkg-query":
            return 0, "".join(f"installed {p}\n" for p in sorted(self.installed)) + "config-files old\n"
        if argv[:2] == ["apt-get", "-s"]:
            names = [a for a in argv[4:] if a != "purge"]
            extra = sorted(self.purge_takes) if set(names) & {"python3-dbus"} else []
            return 0, "".join(f"Purg {n} [1.0]\n" for n in [*names, *extra])
        if argv[0] == "apt-cache":
            return 0, self.depends
        if argv[0] == "getent":
            return 0, self.passwd if argv[1] == "passwd" else self.group
        if argv[0] == "ps":
            user = argv[-1]
            return (0, " 4242\n") if user in self.busy else (1, "")
        return 0, ""


def test_packages_undo_purges_what_the_role_added_and_never_what_was_there_before():
    apt = Apt(["tuned", "python3-dbus", "bash", "python3", "wrk"])
    result, after = PKG.undo(RECORD, "cpu_tuning", keep=False, check=False, runner=apt)
    # tuned had left its configuration files before the first run: removed, so they stay.
    assert result["purged"] == ["python3-dbus"] and result["removed"] == ["tuned"]
    assert result["kept"] == {"bash": "installed before the first run"}
    assert ["apt-get", "-y", "-q", "purge", "python3-dbus"] in apt.ran and ["apt-get", "-y", "-q", "remove", "tuned"] in apt.ran
    assert not [a for a in apt.ran if "wrk" in a], "another role's package is not this role's to purge"
    assert after["added"] == {"common": ["wrk"]} and not PKG.empty(after)


def test_packages_undo_keeps_a_package_that_something_installed_since_needs():
    depends = "myapp\n  Depends: python3-dbus\n  Depends: libc6\npython3-dbus\n  Depends: python3\n"
    apt = Apt(["tuned", "python3-dbus", "myapp"], purge_takes=["myapp"], depends=depends)
    result, after = PKG.undo(RECORD, "cpu_tuning", keep=False, check=False, runner=apt)
    assert "python3-dbus" in result["kept"] and "myapp" in result["kept"]["python3-dbus"]
    assert result["removed"] == ["tuned"] and result["purged"] == []
    assert not [a for a in apt.ran if a[:2] == ["apt-get", "-y"] and "python3-dbus" in a]
    assert after["added"]["cpu_tuning"] == ["python3-dbus"], "kept for a later undo"


def test_packages_undo_check_mode_and_keep_change_nothing():
    apt = Apt(["tuned", "python3-dbus"])
    result, _ = PKG.undo(RECORD, "cpu_tuning", keep=False, check=True, runner=apt)
    assert result["changed"] and result["purged"] == ["python3-dbus"]
    assert not [a for a in apt.ran if a[0] == "apt-get" and "-s" not in a]
    apt = Apt(["tuned", "python3-dbus"])
    result, after = PKG.undo(RECORD, "cpu_tuning", keep=True, check=False, runner=apt)
    assert result["purged"] == result["removed"] == [] and result["kept"]["tuned"] == "kept on purpose"
    assert not [a for a in apt.ran if a[0] == "apt-get"] and "cpu_tuning" not in after["added"]


def test_packages_undo_deletes_the_users_and_groups_the_packages_made_unless_busy():
    passwd, group = "prometheus:x:105:110::/var/lib/prometheus:/usr/sbin/nologin\n", "prometheus:x:110:\n"
    apt = Apt([], passwd=passwd, group=group)
    result, after = PKG.undo(RECORD, "monitoring", keep=False, check=False, runner=apt)
    assert result["users"] == ["prometheus"] and ["userdel", "prometheus"] in apt.ran
    assert PKG.forget(RECORD, "monitoring") == after and "monitoring" not in after["users_added"]
    apt = Apt([], passwd=passwd, group=group, busy=["prometheus"])
    result, _ = PKG.undo(RECORD, "monitoring", keep=False, check=False, runner=apt)
    assert result["users"] == [] and "4242" in result["kept"]["user prometheus"]
    assert result["kept"]["group prometheus"] and not [a for a in apt.ran if a[0] in ("userdel", "groupdel")]


def test_packages_undo_of_a_role_without_entries_reads_nothing_and_the_last_one_empties_the_record():
    apt = Apt([])
    result, after = PKG.undo(RECORD, "hugepages", keep=False, check=False, runner=apt)
    assert result["changed"] is False and after is RECORD and apt.ran == []
    assert PKG.empty(PKG.forget(PKG.forget(PKG.forget(RECORD, "cpu_tuning"), "common"), "monitoring"))


def test_packages_undo_parses_apt_and_dpkg():
    assert PKG.simulated_removals("Remv a [1]\nPurg b [2]\nInst c\n") == {"a", "b"}
    assert PKG.hard_dependencies("x\n  Depends: <y>\n  Recommends: z\n |PreDepends: w:any\n") == {"x", "y", "w"}
    assert PKG.dpkg_states(["installed a", "config-files b", ""]) == {"a": "installed", "b": "config-files"}
    assert PKG.split_config_files(RECORD, ["wrk", "tuned"]) == (["wrk"], ["tuned"])


def test_packages_undo_without_a_record_does_nothing(tmp_path, capsys):
    assert PKG.main([str(tmp_path / "packages.json"), "common"]) == 0
    assert json.loads(capsys.readouterr().out)["changed"] is False
    assert PKG.main([str(tmp_path / "packages.json")]) == 2


def test_a_daemon_left_running_by_its_purged_package_is_stopped_not_counted_as_the_users_work():
    apt = Apt([], busy=["polkitd", "prometheus"])
    stopped: list[list[str]] = []
    busy = PKG.busy_users(apt, ["polkitd", "prometheus", "nobody-here"], leftover=lambda pid: True, stopper=stopped.append)
    assert busy == {} and stopped == [["4242"], ["4242"]]
    stopped.clear()
    assert PKG.busy_users(apt, ["polkitd"], check=True, leftover=lambda pid: True, stopper=stopped.append) == {}
    assert stopped == [], "check mode stops nothing"
    assert PKG.busy_users(apt, ["polkitd"], leftover=lambda pid: False, stopper=stopped.append) == {
        "polkitd": "runs processes 4242"} and stopped == []
