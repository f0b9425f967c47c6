"""Role shared, run for real on this machine (local connection, a scratch state directory):
undo records written once, extended on a later run, read back, and removed; and the
conventions of its entry points and of the roles that record originals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import plugin_code
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
BIN = Path(sys.executable).parent
GROW = plugin_code.load("filter", "provisioner").provisioner_originals_grow

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the records are owned by root")


def play(tmp_path: Path, tasks: list[dict], check: bool = False) -> dict:
    """Run TASKS on localhost with common_state_dir in TMP_PATH; the JSON callback's result."""
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump([{"name": "Shared", "hosts": "localhost", "connection": "local",
                                     "gather_facts": False, "vars": {"common_state_dir": str(tmp_path / "state")},
                                     "tasks": tasks}]))
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "ANSIBLE_ROLES_PATH": str(ROLES),
           "ANSIBLE_FILTER_PLUGINS": str(plugin_code.PLUGINS / "filter"), "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
           "ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
           "ANSIBLE_PYTHON_INTERPRETER": sys.executable}
    r = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(book), *(["--check"] if check else [])],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    return json.loads(r.stdout)


def shared(entry: str, **variables) -> dict:
    return {"name": f"shared {entry}", "ansible.builtin.include_role": {"name": "shared", "tasks_from": entry},
            "vars": {"shared_role": "demo", **variables}}


def show(*names: str) -> dict:
    return {"name": "Show", "ansible.builtin.debug": {"msg": {n: f"{{{{ {n} }}}}" for n in names}}}


def changed(result: dict) -> list[str]:
    return [t["task"]["name"].removeprefix("shared : ") for t in result["plays"][0]["tasks"] if t["hosts"]["localhost"].get("changed")]


def shown(result: dict) -> dict:
    return result["plays"][0]["tasks"][-1]["hosts"]["localhost"]["msg"]


def test_a_record_is_written_once_grows_on_later_runs_and_is_removed_last(tmp_path):
    record = tmp_path / "state" / "originals" / "demo.json"
    first = {"role": "demo", "value": 1, "created": ["/etc/a"]}
    assert "Record the originals before the first change (first run only) of demo" in changed(
        play(tmp_path, [shared("record", shared_originals=first, shared_grow=["created"])]))
    assert json.loads(record.read_text()) == first
    assert oct(record.stat().st_mode & 0o777) == "0o600"

    # A later run: the original value stays, the new file joins the record; again: no change.
    later = {"role": "demo", "value": 2, "created": ["/etc/b", "/etc/a"]}
    assert changed(play(tmp_path, [shared("record", shared_originals=later, shared_grow=["created"])])) == [
        "Add what this run creates to the record of demo"]
    assert json.loads(record.read_text()) == {"role": "demo", "value": 1, "created": ["/etc/a", "/etc/b"]}
    assert changed(play(tmp_path, [shared("record", shared_originals=later, shared_grow=["created"])])) == []

    result = play(tmp_path, [shared("read"), show("shared_recorded", "shared_recorded_exists")], check=True)
    assert shown(result) == {"shared_recorded": json.loads(record.read_text()), "shared_recorded_exists": True}

    play(tmp_path, [shared("remove")])
    assert not record.exists()
    assert shown(play(tmp_path, [shared("read"), show("shared_recorded", "shared_recorded_exists")])) == {
        "shared_recorded": {}, "shared_recorded_exists": False}


def test_a_record_written_before_role_shared_is_read_and_grown(tmp_path):
    """Hosts provisioned by an earlier release: the same file, JSON without a final newline, mode 0644."""
    record = tmp_path / "state" / "originals" / "demo.json"
    record.parent.mkdir(parents=True)
    old = {"created": ["/etc/a"], "nr_hugepages": 0, "role": "demo"}
    record.write_text(json.dumps(old, indent=4, sort_keys=True))
    record.chmod(0o644)
    assert shown(play(tmp_path, [shared("read"), show("shared_recorded")])) == {"shared_recorded": old}
    play(tmp_path, [shared("record", shared_originals={"role": "demo", "nr_hugepages": 64, "created": ["/etc/c"]},
                           shared_grow=["created"])])
    assert json.loads(record.read_text()) == {"created": ["/etc/a", "/etc/c"], "nr_hugepages": 0, "role": "demo"}


def test_remove_dirs_keeps_a_directory_that_holds_anything(tmp_path):
    empty, kept = tmp_path / "empty.d", tmp_path / "kept.d"
    empty.mkdir()
    kept.mkdir()
    (kept / ".admin").write_text("x")
    play(tmp_path, [shared("remove_dirs", shared_dirs=[str(empty), str(kept), str(tmp_path / "gone.d")])])
    assert not empty.exists() and (kept / ".admin").exists()


def test_grow_extends_only_the_named_lists():
    recorded = {"created": ["/a"], "created_dirs": [], "value": 1}
    assert GROW(recorded, {"created": ["/b", "/a"], "created_dirs": ["/d"], "value": 2}, ["created", "created_dirs"]) == {
        "created": ["/a", "/b"], "created_dirs": ["/d"], "value": 1}
    assert GROW({}, {"created": ["/a"]}, ["created"]) == {"created": ["/a"]}


def test_installed_packages_go_to_no_apt_and_dpkg_is_read_once_a_run(tmp_path):
    """A converged host: role shared's packages entry point reads dpkg's database once for every
    role that includes it and calls no apt at all (no package lists refreshed, no cache opened)."""
    result = play(tmp_path, [shared("packages", shared_packages=["dpkg", "coreutils"]),
                             shared("packages", shared_packages=["dpkg"]),
                             show("shared_installed_packages")])
    tasks = result["plays"][0]["tasks"]
    ran = [t["task"]["name"].removeprefix("shared : ") for t in tasks
           if not t["hosts"]["localhost"].get("skipped") and "Show" not in t["task"]["name"]]
    assert ran.count("Read the installed packages (once a run)") == 1, ran
    assert not [n for n in ran if "Refresh the package lists" in n or n.startswith("Install the packages")], ran
    assert {"dpkg", "coreutils"} <= set(shown(result)["shared_installed_packages"])


def test_indexes_that_do_not_answer_are_named_and_one_that_answers_with_an_error_is_kept(tmp_path):
    """Real probes from this machine: a local index that answers, one answering 404, a closed
    port and a name that cannot resolve (.invalid never does); also in check mode."""
    import http.server
    import socket
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # bound, never listening: refused once closed
    answers = f"http://127.0.0.1:{server.server_port}/"
    missing = f"http://127.0.0.1:{server.server_port}/no/such/index/"
    refused = f"http://127.0.0.1:{closed}/simple/"
    unknown = "https://pypi.provisioner.invalid/simple/"
    try:
        for check in (False, True):
            result = play(tmp_path, [shared("indexes", shared_indexes=[answers, missing, refused, unknown],
                                            shared_index_fix="use another index", shared_index_timeout=5),
                                     show("shared_unreachable_indexes")], check=check)
            assert shown(result)["shared_unreachable_indexes"] == [refused, unknown]
            warnings = [t["hosts"]["localhost"] for t in result["plays"][0]["tasks"] if "Say which" in t["task"]["name"]]
            said = [r["msg"] for r in warnings[0]["results"]]
            assert len(said) == 2 and all(m.startswith("WARNING demo: the package index ") for m in said)
            assert refused in said[0] and "refused" in said[0].lower() and said[0].endswith("use another index")
    finally:
        server.shutdown()


def test_the_packages_record_keeps_the_first_state_and_undo_never_purges_what_was_there(tmp_path):
    """Entry points packages_record and packages_added, for real on this machine's dpkg: a run
    whose reading of dpkg lacked coreutils finds it after its install, so coreutils is what that
    install added; the record of the first install stays as written. packages_undo then finds
    coreutils among the packages installed before the first install: it touches no package,
    forgets the role's entries and removes the emptied record; a second undo does nothing."""
    record = tmp_path / "state" / "originals" / "packages.json"
    steps = [shared("packages", shared_packages=["dpkg"]),
             {"name": "Lose coreutils", "ansible.builtin.set_fact": {
                 "shared_installed_packages": "{{ shared_installed_packages | difference(['coreutils']) }}"}},
             {"name": "Before", "ansible.builtin.include_role": {"name": "shared", "tasks_from": "packages_record"},
              "vars": {"shared_role": "demo"}},
             {"name": "After", "ansible.builtin.include_role": {"name": "shared", "tasks_from": "packages_added"},
              "vars": {"shared_role": "demo"}}]
    result = play(tmp_path, steps + steps)  # the same install twice: the first state stays as written
    assert changed(result).count("Record the packages before the first install (first run only)") == 1
    first = json.loads(record.read_text())
    assert oct(record.stat().st_mode & 0o777) == "0o600"
    assert first["added"] == {"demo": ["coreutils"]} and first["removed"] == {} and first["users_added"] == {}
    assert {"dpkg", "coreutils"} <= set(first["before"]["installed"]) and first["provisioned_before"] is False

    undo = shared("packages_undo")
    checked = play(tmp_path, [undo], check=True)
    assert json.loads(record.read_text()) == first, "check mode writes nothing"
    assert "coreutils (installed before the first run)" in json.dumps(checked)
    assert changed(play(tmp_path, [undo, undo])) == ["Purge the packages the installs added, for demo"]
    assert not record.exists()
    assert subprocess.run(["dpkg-query", "--show", "coreutils"], capture_output=True).returncode == 0
