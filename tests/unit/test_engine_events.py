"""The engine's reading of ansible-runner events: bad input by the play it failed in, diffs as text."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner import engine, paths
from provisioner.errors import ExitCode
from provisioner.runs import Diff, RunResult


def play_start(uuid: str, name: str) -> dict:
    return {"event": "playbook_on_play_start", "event_data": {"play_uuid": uuid, "uuid": uuid, "name": name, "play": name}}


def failed(host: str, play_uuid: str, task: str, **data) -> dict:
    event_data = {"host": host, "play_uuid": play_uuid, "task": task, "res": {"msg": f"{task} failed"}, **data}
    return {"event": "runner_on_failed", "event_data": event_data}


def ok(host: str, play_uuid: str, task: str, **res) -> dict:
    return {"event": "runner_on_ok", "event_data": {"host": host, "play_uuid": play_uuid, "task": task, "res": res}}


def collect(events: list[dict], input_plays: frozenset[int] = frozenset({0})) -> RunResult:
    c = engine._EventCollector(None, input_plays)
    for e in events:
        c.handle(e)
    return RunResult("site.yml", False, 2, c.hosts, c.facts, c.changes, Path("/tmp"), 0.0)


# Task paths name files as the roles do: the classification must not read them.
PREFLIGHT_PATH = "/roles/storage/tasks/preflight.yml:12"
INSTALL_PATH = "/roles/common/tasks/install.yml:3"


def test_a_failure_in_the_input_check_play_is_bad_input_whatever_the_task_file():
    run = collect([play_start("p1", "Discover"), failed("web1", "p1", "Check the drives", task_path=INSTALL_PATH)])
    assert run.hosts["web1"].status == "refused"
    assert run.exit_code == ExitCode.BAD_INPUT


def test_a_failure_in_a_later_play_is_a_host_failure_even_from_a_file_named_preflight():
    events = [
        play_start("p1", "Discover"),
        ok("web1", "p1", "Derive the plan"),
        play_start("p2", "Base system"),
        failed("web1", "p2", "Check the input", task_path=PREFLIGHT_PATH, role="common"),
    ]
    run = collect(events)
    assert run.hosts["web1"].status == "failed"
    assert run.exit_code == ExitCode.HOST_FAILED


def test_a_failure_of_the_plan_role_outside_the_input_check_is_a_host_failure():
    run = collect([play_start("p1", "Only play"), failed("web1", "p1", "Derive the plan", role="plan")], frozenset())
    assert run.exit_code == ExitCode.HOST_FAILED


def test_an_argument_spec_refusal_is_bad_input_in_any_play():
    events = [
        play_start("p1", "Discover"),
        play_start("p2", "Base system"),
        failed("web1", "p2", "Validating arguments against arg spec main", resolved_action="ansible.builtin.validate_argument_spec"),
    ]
    assert collect(events).exit_code == ExitCode.BAD_INPUT


def test_a_play_started_again_for_a_second_batch_keeps_its_position():
    events = [
        play_start("p1", "Discover"),
        play_start("p1_1", "Discover"),  # serial: the next batch of hosts
        failed("web2", "p1_1", "Check the drives"),
        play_start("p2", "Base system"),
        failed("web1", "p2", "Install packages"),
    ]
    run = collect(events)
    assert run.hosts["web2"].status == "refused" and run.hosts["web1"].status == "failed"
    assert run.exit_code == ExitCode.HOST_FAILED  # one host failed for real: that decides


def test_the_shipped_playbooks_mark_their_read_only_first_play():
    assert engine.input_check_plays(paths.PLAYBOOKS / "site.yml") == {0}
    assert engine.input_check_plays(paths.PLAYBOOKS / "facts.yml") == {0}
    assert engine.input_check_plays(paths.PLAYBOOKS / "smoke.yml") == {0}
    assert engine.input_check_plays(paths.PLAYBOOKS / "undo.yml") == set()
    assert engine.input_check_plays(paths.PLAYBOOKS / "reboot.yml") == set()


def test_input_check_marks_follow_imported_playbooks(tmp_path: Path):
    (tmp_path / "inner.yml").write_text("- {name: a, hosts: all, vars: {provisioner_input_check: true}}\n- {name: b, hosts: all}\n")
    (tmp_path / "outer.yml").write_text("- {name: z, hosts: all}\n- import_playbook: inner.yml\n")
    assert engine.input_check_plays(tmp_path / "outer.yml") == {1}


def test_diffs_become_before_and_after_text():
    assert engine.diffs_of({"prepared": "Installed: htop\n"}) == [Diff(text="Installed: htop")]
    file_diff = {"before": "a\n", "after": "b\n", "before_header": "/etc/x (content)", "after_header": "/etc/x (content)"}
    assert engine.diffs_of([file_diff]) == [Diff("a\n", "b\n", "/etc/x (content)", "/etc/x (content)")]
    state = engine.diffs_of({"before": {"state": "absent", "mode": "0644"}, "after": {"state": "file", "mode": "0644"}})
    assert state == [Diff("state: 'absent'\n", "state: 'file'\n")]
    assert engine.diffs_of(None) == []


def test_a_change_without_a_diff_is_still_listed():
    run = collect([play_start("p1", "x"), ok("web1", "p1", "Create the ML user", changed=True)])
    assert [(c.host, c.task, c.diff) for c in run.changes] == [("web1", "Create the ML user", [])]
    assert run.to_dict()["changes"] == [{"host": "web1", "task": "Create the ML user", "diff": []}]


def test_missing_ansible_tools_are_one_clear_line_not_a_traceback(tmp_path, monkeypatch) -> None:
    import sys

    from provisioner.errors import ProvisionerError

    # An interpreter whose bin directory holds no Ansible tools, and nothing else on PATH.
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ProvisionerError) as err:
        engine.ensure_tools_on_path()
    assert err.value.exit_code == ExitCode.INTERNAL
    assert str(err.value).startswith("ansible-playbook and ansible-inventory not found beside")
    assert "reinstall provisioner" in str(err.value)


def test_a_roles_warning_reaches_the_summary_once_per_host_and_item():
    def item_ok(host: str, msg: str, action: str = "ansible.builtin.debug") -> dict:
        return {"event": "runner_item_on_ok",
                "event_data": {"host": host, "play_uuid": "p2", "task": "Say", "task_action": action, "res": {"msg": msg}}}

    events = [
        play_start("p1", "Discover"),
        play_start("p2", "Install"),
        item_ok("web1", "WARNING mlstack: the package index https://a.example does not answer"),
        item_ok("web1", "WARNING mlstack: the package index https://a.example does not answer"),
        item_ok("web2", "WARNING storage: drive nvme1n1 is small"),
        item_ok("web2", "an ordinary message"),
        item_ok("web2", "WARNING not a debug task's", action="ansible.builtin.command"),
        {"event": "runner_on_ok", "event_data": {"host": "web2", "play_uuid": "p2", "task": "Say",
                                                 "task_action": "ansible.builtin.debug", "res": {"msg": "WARNING one"}}},
    ]
    run = collect(events)
    assert run.warnings == ["web1: mlstack: the package index https://a.example does not answer",
                            "web2: storage: drive nvme1n1 is small", "web2: one"]
    assert run.to_dict()["hosts"]["web2"]["warnings"] == ["storage: drive nvme1n1 is small", "one"]
    assert {h.status for h in run.hosts.values()} == {"ok"}  # a warning is not a failure


def test_a_failed_loop_names_the_item_that_failed_and_its_error():
    res = {
        "msg": "One or more items failed",
        "results": [
            {"failed": False, "_ansible_item_label": "wipefs --all /dev/vdb", "rc": 0},
            {"failed": True, "_ansible_item_label": "mkfs.xfs /dev/md/data", "rc": 1, "msg": "non-zero return code",
             "stderr": "mkfs.xfs: probe of /dev/md/data\nError opening /dev/md/data: No such file or directory"},
        ],
    }
    run = collect([play_start("p1", "Discover"), play_start("p2", "Storage"), failed("web1", "p2", "Create", res=res)])
    (error,) = run.hosts["web1"].errors
    assert error == (
        "Create: One or more items failed: mkfs.xfs /dev/md/data: non-zero return code: "
        "Error opening /dev/md/data: No such file or directory"
    )
    assert "wipefs" not in error
