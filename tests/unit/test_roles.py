"""Conventions every role keeps: documented options, role and phase tags, lint-clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks" / "main.yml").exists())


def load(path: Path):
    return yaml.safe_load(path.read_text()) or {}


@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_documented_with_the_same_default(role):
    defaults = load(ROOT / "roles" / role / "defaults" / "main.yml")
    spec = load(ROOT / "roles" / role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert set(defaults) == set(spec), f"defaults and argument_specs differ: {set(defaults) ^ set(spec)}"
    for name, value in defaults.items():
        assert spec[name].get("description"), f"{name} has no description"
        assert spec[name].get("type"), f"{name} has no type"
        if value is not None and not (isinstance(value, str) and "{{" in value):
            assert spec[name].get("default") == value, f"{name}: default {value!r} vs spec {spec[name].get('default')!r}"
        assert name.startswith(f"{role}_"), f"{name} is not prefixed with the role name"


@pytest.mark.parametrize("role", ROLES)
def test_main_includes_phases_tagged_by_role_and_phase(role):
    tasks = load(ROOT / "roles" / role / "tasks" / "main.yml")
    for task in tasks:
        tags = set(task.get("tags", []))
        assert role in tags, f"{task.get('name')}: missing the role tag {role}"
        assert any(t.startswith(f"{role}_") for t in tags), f"{task.get('name')}: missing a phase tag"


def test_ansible_lint_production_profile():
    bindir = Path(sys.executable).parent
    r = subprocess.run(
        # The whole repository as Galaxy sees the collection (.ansible-lint excludes what is not).
        [str(bindir / "ansible-lint")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}", "NO_COLOR": "1"},
        # A guard against a hung lint, not a time limit: on a loaded 2-core machine it took 3.5 min.
        timeout=1200,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


# --------------------------------------------------------------------------
# role shared: the plumbing the roles share (undo records)
# --------------------------------------------------------------------------

SHARED = ROOT / "roles" / "shared"
# Roles that change host values and record the originals for their undo.
RECORDING = sorted(
    r for r in ROLES
    if (ROOT / "roles" / r / "tasks" / "record.yml").exists()
    and "tasks_from: record" in (ROOT / "roles" / r / "tasks" / "record.yml").read_text()
)


def _task_files(role: str) -> list[Path]:
    return sorted((ROOT / "roles" / role / "tasks").glob("*.yml"))


def test_shared_entry_points_are_its_task_files_and_documented():
    specs = load(SHARED / "meta" / "argument_specs.yml")["argument_specs"]
    assert set(specs) == {p.stem for p in (SHARED / "tasks").glob("*.yml")}
    assert not (SHARED / "tasks" / "main.yml").exists(), "shared is included by entry point, never applied whole"
    for entry, body in specs.items():
        assert body.get("short_description", "").startswith("Internal"), entry
        for name, option in body["options"].items():
            assert name.startswith("shared_"), f"{entry}: {name}"
            assert option.get("description") and option.get("type"), f"{entry}: {name}"


def test_every_role_that_changes_host_values_records_them():
    assert RECORDING == ["allocator", "common", "cpu_tuning", "hugepages", "mlstack", "monitoring", "ray", "serving", "storage", "thread_env"]
    for role in ROLES:
        has_undo = (ROOT / "roles" / role / "tasks" / "undo.yml").exists()
        assert (role in RECORDING) == (has_undo and role != "smoke"), role


@pytest.mark.parametrize("role", RECORDING)
def test_the_record_phase_comes_first_and_runs_with_every_later_phase(role):
    tasks = load(ROOT / "roles" / role / "tasks" / "main.yml")
    # A phase is imported (its tags reach every task) or, when skipped on most hosts, included
    # with the same tags applied to every task.
    phases = [t.get("ansible.builtin.import_tasks") or t["ansible.builtin.include_tasks"] for t in tasks]
    files = [phase["file"] for phase in phases]
    assert files[:2] == ["preflight.yml", "record.yml"], files
    record_tags = set(tasks[1]["tags"])
    assert f"{role}_record" in record_tags
    for task, phase in zip(tasks, phases, strict=False):
        if "ansible.builtin.include_tasks" in task:
            assert set(phase["apply"]["tags"]) == set(task["tags"]), f"{role}: {phase['file']}'s tasks lack its tags"
    for task in tasks[2:]:
        phase = next(t for t in task["tags"] if t.startswith(f"{role}_"))
        assert phase in record_tags, f"--tags {phase} would change {role} without recording the originals"


@pytest.mark.parametrize("role", RECORDING)
def test_records_are_read_and_removed_through_shared(role):
    undo = "\n".join(p.read_text() for p in _task_files(role) if p.name.startswith(("undo", "read")))
    assert "tasks_from: read" in undo and "tasks_from: remove" in undo
    for path in [*_task_files(role), ROOT / "roles" / role / "vars" / "main.yml"]:
        code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        # The record's file is role shared's: no role names it, writes it or deletes it itself.
        assert f"originals/{role}.json" not in code and "_originals_file" not in code, path


# --------------------------------------------------------------------------
# preflight: the argument spec validates the options
# --------------------------------------------------------------------------

SITE_PREFLIGHTS = sorted(
    task["ansible.builtin.import_role"]["name"]
    for task in load(ROOT / "playbooks" / "site.yml")[0]["tasks"]
    if task.get("ansible.builtin.import_role", {}).get("tasks_from") == "preflight"
)


def test_site_runs_every_preflight_first():
    assert sorted(r for r in ROLES if (ROOT / "roles" / r / "tasks" / "preflight.yml").exists()
                                     and r != "smoke") == SITE_PREFLIGHTS


@pytest.mark.parametrize("role", SITE_PREFLIGHTS)
def test_preflight_entry_point_validates_the_main_options(role):
    specs = load(ROOT / "roles" / role / "meta" / "argument_specs.yml")["argument_specs"]
    assert specs["preflight"]["options"] == specs["main"]["options"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the preflight looks up accounts as root")
def test_a_bad_choice_is_refused_by_the_spec_naming_the_option(tmp_path):
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump([{
        "name": "Preflight", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "tasks": [{"name": "Check the input of role storage",
                   "ansible.builtin.include_role": {"name": "storage", "tasks_from": "preflight"}}],
    }]))
    bindir = Path(sys.executable).parent
    r = subprocess.run(
        [str(bindir / "ansible-playbook"), "-i", "localhost,", str(book), "-e", "storage_level=raid5",
         "-e", "storage_chunk_kb=100", "-e", f"ansible_python_interpreter={sys.executable}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}", "ANSIBLE_NOCOLOR": "1",
             "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json", "ANSIBLE_LOCALHOST_WARNING": "false"},
    )
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-2000:]
    tasks = json.loads(r.stdout)["plays"][0]["tasks"]
    failed = [t for t in tasks if t["hosts"]["localhost"].get("failed")]
    assert [t["task"]["name"] for t in failed] == ["storage : Validating arguments against arg spec 'preflight' - "
                                                  "Check the options of role storage and the host before any change "
                                                  "(site.yml runs every preflight first)"]
    errors = " ".join(failed[0]["hosts"]["localhost"]["argument_errors"])
    assert "storage_level must be one of: raid0, raid1, raid10, single, got: raid5" in errors
    assert "storage_chunk_kb must be one of" in errors


def _tasks(node):
    """Every task mapping in a task file, blocks and their rescue/always included."""
    for task in node if isinstance(node, list) else []:
        if isinstance(task, dict):
            yield task
            for key in ("block", "rescue", "always"):
                yield from _tasks(task.get(key))


COMMAND_MODULES = ("ansible.builtin.command", "ansible.builtin.script", "ansible.builtin.shell")


def test_a_command_line_written_folded_stays_one_line():
    """A folded scalar (>-) keeps the newline around a line indented further than the first:
    the shell then runs the rest as a second command (`--serve-script: not found`)."""
    broken = []
    for path in sorted((ROOT / "roles").glob("*/tasks/*.yml")):
        for task in _tasks(load(path)):
            for module in COMMAND_MODULES:
                args = task.get(module)
                line = args.get("cmd") if isinstance(args, dict) else args
                if module != "ansible.builtin.shell" and isinstance(line, str) and "\n" in line.strip():
                    broken.append(f"{path.relative_to(ROOT)}: {task.get('name')}")
    assert broken == []


def test_every_apt_task_runs_under_debians_own_python():
    """The apt module imports python3-apt, which only Debian's /usr/bin/python3 has. On the local
    connection Ansible's interpreter is the control node's venv; there the module starts itself
    again under another Python, and that fallback fails under Mitogen ("module '__main__' has no
    attribute '_module_fqn'"): the first `provisioner up` of a machine missing a package failed."""
    role_vars: dict[str | None, dict] = {  # a playbook's tasks (role None) have none
        role: load(ROOT / "roles" / role / "vars" / "main.yml") or {}
        for role in [*ROLES, "shared"]
        if (ROOT / "roles" / role / "vars" / "main.yml").exists()
    }
    found, wrong = [], []
    for path in sorted([*(ROOT / "roles").glob("*/tasks/*.yml"), *(ROOT / "playbooks").glob("*.yml")]):
        role = path.parts[-3] if path.parent.name == "tasks" else None
        nodes = load(path) or []
        if path.parent.name == "playbooks":
            nodes = [t for play in nodes for key in ("pre_tasks", "tasks", "post_tasks") for t in play.get(key) or []]
        for task in _tasks(nodes):
            if "ansible.builtin.apt" not in task:
                continue
            found.append(path)
            python = (task.get("vars") or {}).get("ansible_python_interpreter", "")
            name = python.strip("{} ")
            if role_vars.get(role, {}).get(name, python) != "/usr/bin/python3":
                wrong.append(f"{path.relative_to(ROOT)}: {task.get('name')} ({python or 'no interpreter set'})")
    assert found, "no apt task found: the search is wrong"
    assert wrong == []
