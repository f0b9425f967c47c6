"""The options a run applied, kept on the host for the verbs after it: `up` hands site.yml the -e
options of each role it applies, role common records them (options.yml: merged by role, root
only), and verify (provisioner.checks), smoke and undo (options_read.yml) judge by them without
the user repeating them; a verb's own -e still wins."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import nullcontext, suppress
from pathlib import Path
from types import SimpleNamespace

import yaml
from playbook_cases import ROOT, local_env

from provisioner import checks, commands, engine, verify
from provisioner.verify import APPLIED_OPTIONS_VAR, applied_options

DEVICES = ["/dev/disk/by-id/nvme-DATA0", "/dev/disk/by-id/nvme-DATA1"]


def test_each_applied_role_gets_its_own_options_and_no_other_roles():
    given = {"storage_devices": DEVICES, "hugepages_count": 1, "cpu_tuning_swappiness": 5, "plan_trials": 4}
    assert applied_options(given, ("plan", "storage", "hugepages", "thread_env")) == {
        "plan": {"plan_trials": 4},
        "storage": {"storage_devices": DEVICES},
        "hugepages": {"hugepages_count": 1},
        "thread_env": {},  # applied with its defaults: an earlier run's options for it are replaced
    }  # cpu_tuning did not run: it never saw its option
    assert applied_options(None, ("plan",)) == {"plan": {}}


def _up_extravars(monkeypatch, tmp_path: Path, **kwargs) -> dict:
    seen: dict = {}

    def run_playbook(playbook, inventory, **run_kwargs):
        seen.update(run_kwargs.get("extravars") or {})
        raise SystemExit  # the run itself is not what this test is about

    monkeypatch.setattr(engine, "run_playbook", run_playbook)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {hosts: {web1: {}}}\n")
    with suppress(SystemExit):
        commands.up(inventory, **kwargs)
    return seen


def test_up_hands_site_yml_the_options_of_the_roles_it_applies(monkeypatch, tmp_path):
    given = {"storage_devices": DEVICES, "hugepages_count": 1, "cpu_tuning_swappiness": 5}
    extra = _up_extravars(monkeypatch, tmp_path, tags=("storage", "hugepages_configure"), extravars=given)
    assert {k: extra[k] for k in given} == given  # the run itself still gets every -e option
    assert extra[APPLIED_OPTIONS_VAR] == {
        "plan": {},
        "storage": {"storage_devices": DEVICES},
        "hugepages": {"hugepages_count": 1},
    }
    # A whole run applies every role of site.yml and ends with the smoke test.
    whole = _up_extravars(monkeypatch, tmp_path, extravars={"smoke_price_per_month": 300})[APPLIED_OPTIONS_VAR]
    assert set(whole) == set(verify.site_roles()) | {"smoke"} and whole["smoke"] == {"smoke_price_per_month": 300}
    assert "smoke" not in _up_extravars(monkeypatch, tmp_path, smoke_after=False)[APPLIED_OPTIONS_VAR]


class FakeHost:
    """What role_vars asks of a testinfra host: its inventory variables and one file, read as root."""

    def __init__(self, inventory: dict, files: dict[str, str]):
        self.files = files
        self.reads: list[str] = []
        self.ansible = SimpleNamespace(get_variables=lambda: dict(inventory))
        self.backend = SimpleNamespace(get_pytest_id=lambda: f"fake-{id(self)}")

    def user(self):
        return SimpleNamespace(uid=0)

    def sudo(self):
        return nullcontext()

    def file(self, path: str):
        self.reads.append(path)
        text = self.files.get(path)
        return SimpleNamespace(exists=text is not None, content_string=text or "")


def test_a_standalone_verify_judges_by_the_recorded_options(monkeypatch):
    recorded = {"schema": 1, "roles": {"storage": {"storage_devices": DEVICES, "storage_level": "raid1"}, "plan": {}}}
    host = FakeHost({"storage_level": "raid0", "storage_chunk_kb": 64}, {checks.OPTIONS_FILE: json.dumps(recorded)})
    checks.RECORDED.clear()
    values = checks.role_vars(host, "storage")
    # The recorded -e options win over the inventory, as they did in the run; the rest stays.
    assert values["storage_devices"] == DEVICES and values["storage_level"] == "raid1"
    assert values["storage_chunk_kb"] == 64
    # The run's own -e options (verify at the end of up) win over what was recorded.
    monkeypatch.setitem(checks.EXTRA_VARS, "storage_level", "raid10")
    assert checks.role_vars(host, "storage")["storage_level"] == "raid10"
    assert host.reads.count(checks.OPTIONS_FILE) == 1  # read once per host
    # Where an inventory moves provisioner's configuration directory, the record is read there.
    moved = FakeHost({"common_config_dir": "/srv/prov/"}, {"/srv/prov/options.json": json.dumps(recorded)})
    assert checks.role_vars(moved, "storage")["storage_level"] == "raid10"
    # Nothing recorded (a host provisioned without the CLI): the inventory and defaults alone.
    checks.RECORDED.clear()
    monkeypatch.delitem(checks.EXTRA_VARS, "storage_level")
    assert checks.role_vars(FakeHost({}, {}), "storage")["storage_devices"] == []
    checks.RECORDED.clear()


PLAYBOOK = """
- name: A first run records storage's options
  hosts: localhost
  gather_facts: false
  vars: {provisioner_applied_options: {plan: {}, storage: {storage_devices: DEVICES, storage_level: raid1}}}
  tasks:
    - {name: record, ansible.builtin.import_role: {name: common, tasks_from: options}}
- name: A run of hugepages alone keeps storage's
  hosts: localhost
  gather_facts: false
  vars: {provisioner_applied_options: {plan: {}, hugepages: {hugepages_count: 1}}}
  tasks:
    - {name: record, ansible.builtin.import_role: {name: common, tasks_from: options}}
- name: The same run again changes nothing
  hosts: localhost
  gather_facts: false
  vars: {provisioner_applied_options: {plan: {}, hugepages: {hugepages_count: 1}}}
  tasks:
    - {name: record, ansible.builtin.import_role: {name: common, tasks_from: options}}
- name: The same run ending with the smoke test (no options of its own) changes nothing either
  hosts: localhost
  gather_facts: false
  vars: {provisioner_applied_options: {plan: {}, hugepages: {hugepages_count: 1}, smoke: {}}}
  tasks:
    - {name: record, ansible.builtin.import_role: {name: common, tasks_from: options}}
- name: Check mode writes nothing
  hosts: localhost
  gather_facts: false
  check_mode: true
  vars: {provisioner_applied_options: {plan: {}, hugepages: {hugepages_count: 2}}}
  tasks:
    - {name: record, ansible.builtin.import_role: {name: common, tasks_from: options}}
- name: A later verb takes them, under its own -e
  hosts: localhost
  gather_facts: false
  tasks:
    - {name: read, ansible.builtin.import_role: {name: common, tasks_from: options_read}}
    - name: keep what it sees
      ansible.builtin.copy:
        dest: "{{ common_config_dir }}/seen.json"
        content: "{{ {'devices': storage_devices, 'level': storage_level, 'count': hugepages_count} | to_json }}"
        mode: "0644"
"""


def test_role_common_records_by_role_and_a_later_verb_reads_them(tmp_path):
    """A real ansible-playbook run on this machine (local connection) into a temporary directory."""
    config = tmp_path / "etc"
    book = tmp_path / "record.yml"
    book.write_text(PLAYBOOK.replace("DEVICES", json.dumps(DEVICES)))
    r = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(book),
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"common_config_dir={config}",
         "-e", "storage_level=raid10"],
        capture_output=True, text=True, cwd=ROOT, env=local_env(), timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    plays = json.loads(r.stdout)["plays"]

    def changed(play: int) -> list[str]:
        tasks = plays[play]["tasks"]
        return [t["task"]["name"].split(" : ", 1)[-1] for t in tasks if t["hosts"]["localhost"].get("changed")]

    assert changed(0) == ["Create provisioner's configuration directory (a first run)",
                          "Record the options of the roles this run applies"]
    assert changed(1) == ["Record the options of the roles this run applies"]
    assert changed(2) == []  # idempotent
    assert changed(3) == []  # a role without options is not recorded: the smoke test's run is the same
    assert changed(4) == ["Record the options of the roles this run applies"]  # would change, writes nothing
    record = config / "options.json"
    assert record.stat().st_mode & 0o777 == 0o600
    assert yaml.safe_load(record.read_text()) == {
        "schema": 1,
        "roles": {"storage": {"storage_devices": DEVICES, "storage_level": "raid1"},
                  "hugepages": {"hugepages_count": 1}},
    }
    # The recorded options stand in for the run's -e; this command's own -e (raid10) wins.
    assert json.loads((config / "seen.json").read_text()) == {"devices": DEVICES, "level": "raid10", "count": 1}
