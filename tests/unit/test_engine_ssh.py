"""Forks sized from the inventory and memory; SSH masters in a private, short directory that the
command closes when it ends."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest

from provisioner import engine, paths
from provisioner.errors import BadInput

GIB = 2**30


def test_forks_are_one_per_host_within_the_memory_bound():
    assert engine.forks_for(1, available_memory=16 * GIB) == 1
    assert engine.forks_for(50, available_memory=16 * GIB) == 50
    # 4 GiB free, 2 GiB kept back, 100 MiB a fork: 20 at once.
    assert engine.forks_for(1000, available_memory=4 * GIB) == 20
    assert engine.forks_for(8, available_memory=GIB) == 1, "short of memory: one host at a time, never none"


def test_forks_override_wins_and_bad_values_are_refused():
    assert engine.forks_for(1000, available_memory=4 * GIB, override="3") == 3
    assert engine.forks_for(2, available_memory=4 * GIB, override="") == 2
    for bad in ("0", "-2", "many"):
        with pytest.raises(BadInput, match="PROVISIONER_FORKS"):
            engine.forks_for(2, override=bad)


def test_ssh_args_reuse_one_master_per_host_in_a_short_private_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISIONER_STATE_DIR", "/var/tmp/pv")
    mux = engine._Multiplexer()
    monkeypatch.setattr(engine.ssh, "_MUX", mux)
    try:
        env = engine._run_env(accept_new_host_keys=False)
        args = env["ANSIBLE_SSH_ARGS"]
        assert args.startswith("-o StrictHostKeyChecking=yes -o ControlMaster=auto -o ControlPersist=")
        assert env["ANSIBLE_PIPELINING"] == "True"
        path = args.split("ControlPath=", 1)[1]
        assert path.startswith(f"/var/tmp/pv/ssh/{os.getpid()}-") and path.endswith("/%C")
        # %C is 40 hex digits; ssh adds 17 characters while it binds the master's socket.
        assert len(path) - 2 + 40 + 17 < 104
        assert mux.directory().stat().st_mode & 0o077 == 0
        assert engine._run_env(accept_new_host_keys=True)["ANSIBLE_SSH_ARGS"].split("ControlPath=")[1] == path
    finally:
        mux.close()
    assert not Path(path).parent.exists()


def test_a_deep_state_directory_puts_the_sockets_under_tmp(monkeypatch):
    monkeypatch.setenv("PROVISIONER_STATE_DIR", "/var/tmp/" + "d" * 80)
    mux = engine._Multiplexer()
    try:
        assert str(mux.directory()).startswith(f"/tmp/provisioner-ssh-{os.geteuid()}/")
    finally:
        mux.close()


def test_closing_removes_the_sockets_and_a_dead_commands_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(Path("/var/tmp") / f"pv-{os.getpid()}"))
    base = Path(os.environ["PROVISIONER_STATE_DIR"]) / "ssh"
    base.mkdir(parents=True, exist_ok=True)
    # A command that was killed: its pid is gone, its socket left behind.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = base / f"{gone.stdout.strip()}-x"
    dead.mkdir()
    left = socket.socket(socket.AF_UNIX)
    left.bind(str(dead / "c0ffee"))
    left.close()
    mux = engine._Multiplexer()
    try:
        mine = mux.directory()
        assert not dead.exists(), "a dead command's sockets are removed by the next command"
        live = socket.socket(socket.AF_UNIX)
        live.bind(str(mine / "beef"))
        live.close()
    finally:
        mux.close()
    assert not mine.exists()
    base.rmdir()
    base.parent.rmdir()


def test_the_strategy_is_ansibles_unless_mitogen_is_asked_for(tmp_path, monkeypatch):
    assert engine._strategy_env(None) == {} and engine._strategy_env("linear") == {}
    with pytest.raises(BadInput, match="PROVISIONER_STRATEGY='fast'"):
        engine._strategy_env("fast")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "mitogen" not in p])
    if importlib.util.find_spec("ansible_mitogen") is None:
        with pytest.raises(BadInput, match="pip install mitogen"):
            engine._strategy_env("mitogen")
    package = tmp_path / "ansible_mitogen"
    (package / "plugins" / "strategy").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert engine._strategy_env("mitogen") == {
        "ANSIBLE_STRATEGY_PLUGINS": str(paths.PLUGINS / "strategy"),
        "ANSIBLE_STRATEGY": "provisioner_mitogen_linear",
        "PROVISIONER_TEMPLATE_CACHE_DIR": str(paths.cache_dir() / "jinja"),
    }


def test_under_mitogen_a_task_keeps_every_cpu(tmp_path):
    """Mitogen pins its processes and what they start to CPU subsets; provisioner's wrapper of
    its strategy switches that off, so a local task sees the CPUs the run was started with."""
    pytest.importorskip("ansible_mitogen", reason="the mitogen package (the test extra) is not installed")
    play = tmp_path / "play.yml"
    play.write_text(
        "- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.command: python3 -c 'import os; print(sorted(os.sched_getaffinity(0)))'\n"
        "      register: cpus\n      changed_when: false\n"
        "    - ansible.builtin.debug: {msg: 'CPUS={{ cpus.stdout }}'}\n"
    )
    r = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            "localhost,",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(play),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **engine._strategy_env("mitogen"), "ANSIBLE_NOCOLOR": "1"},
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"CPUS={sorted(os.sched_getaffinity(0))}" in r.stdout, r.stdout[-2000:]


def test_testinfra_reads_the_same_masters_while_verify_runs(monkeypatch):
    from testinfra.utils.ansible_runner import get_ansible_config

    monkeypatch.setenv("PROVISIONER_STATE_DIR", "/var/tmp/pv")
    mux = engine._Multiplexer()
    monkeypatch.setattr(engine.ssh, "_MUX", mux)
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    try:
        with engine.shared_ssh_masters():
            args = get_ansible_config().get("ssh_connection", "ssh_args")
            assert args == engine._run_env(accept_new_host_keys=False)["ANSIBLE_SSH_ARGS"]
            assert f"ControlPath={mux.directory()}/%C" in args
        assert "ANSIBLE_CONFIG" not in os.environ
        assert list(mux.directory().iterdir()) == []
    finally:
        mux.close()


# --------------------------------------------------------------------------- host keys under Mitogen


def _host_keys_module():
    name = "provisioner_strategy_host_keys_test"
    spec = importlib.util.spec_from_file_location(name, Path(paths.PLUGINS) / "strategy" / "_host_keys.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mitogen_kwargs(**over):
    kwargs = {
        "check_host_keys": "enforce",
        "hostname": "10.213.9.2",
        "username": "root",
        "port": None,
        "ssh_path": "ssh",
        "ssh_args": ["-o", "StrictHostKeyChecking=accept-new", "-o", "UserKnownHostsFile=/inv/known_hosts"],
    }
    return {**kwargs, **over}


def test_accepting_new_keys_turns_mitogens_enforce_into_accept_and_nothing_else():
    keys = _host_keys_module()
    kwargs = _mitogen_kwargs()
    adjusted = keys.adjust(kwargs, "accept-new", "")
    # Mitogen's "accept" answers ssh's prompt for an unknown key; a changed key fails before any prompt.
    assert adjusted["check_host_keys"] == "accept" and adjusted["ssh_args"] == kwargs["ssh_args"]
    assert kwargs["check_host_keys"] == "enforce", "the caller's arguments are left alone"
    assert keys.adjust(kwargs, "", "") == kwargs, "without --accept-new-host-keys keys are enforced"
    ignore = _mitogen_kwargs(check_host_keys="ignore")
    assert keys.adjust(ignore, "accept-new", "") == ignore, "host_key_checking off stays the user's choice"


def test_a_check_run_records_first_seen_keys_only_in_copies(tmp_path):
    keys = _host_keys_module()
    original = tmp_path / "known_hosts"
    original.write_text("10.213.9.9 ssh-ed25519 AAAAold\n")
    scratch = tmp_path / "scratch"
    looked = []

    def lookup(ssh_path, args, host, port, user):
        looked.append((ssh_path, tuple(args), host, user))
        return [str(original), str(tmp_path / "absent")]

    first = keys.adjust(_mitogen_kwargs(), "accept-new", str(scratch), lookup)
    assert first["check_host_keys"] == "accept"
    option, value = first["ssh_args"][:2]
    assert option == "-o" and value.startswith("UserKnownHostsFile=")
    copies = value.removeprefix("UserKnownHostsFile=").split()
    assert [Path(c).parent for c in copies] == [scratch, scratch]
    assert Path(copies[0]).read_text() == original.read_text(), "the copy holds the recorded keys: a changed key is refused"
    assert Path(copies[1]).read_text() == ""
    assert first["ssh_args"][2:] == _mitogen_kwargs()["ssh_args"]
    Path(copies[0]).write_text(original.read_text() + "10.213.9.2 ssh-ed25519 AAAAnew\n")  # what ssh records
    again = keys.adjust(_mitogen_kwargs(), "accept-new", str(scratch), lookup)
    assert again["ssh_args"] == first["ssh_args"], "every connection of the run reads the same copies"
    assert "AAAAnew" in Path(copies[0]).read_text() and "AAAAnew" not in original.read_text()
    assert looked[0] == ("ssh", tuple(_mitogen_kwargs()["ssh_args"]), "10.213.9.2", "root")


def test_a_check_run_that_cannot_name_the_known_hosts_files_refuses_to_connect(tmp_path):
    keys = _host_keys_module()
    with pytest.raises(RuntimeError, match=r"cannot tell which known_hosts files.*ssh-keyscan"):
        keys.adjust(_mitogen_kwargs(), "accept-new", str(tmp_path), lambda *a: [])
    assert list(tmp_path.iterdir()) == []


def test_ssh_names_the_known_hosts_files_it_would_use(tmp_path):
    keys = _host_keys_module()
    chosen = tmp_path / "kh"
    assert keys.known_hosts_files("ssh", ["-o", f"UserKnownHostsFile={chosen}"], "10.213.9.2", None, "root") == [str(chosen)]
    # Without one in the arguments: ssh's own default (the user's config may name others).
    default = keys.known_hosts_files("ssh", [], "10.213.9.2", 22, "root")
    assert default and all(os.path.isabs(f) for f in default)
    assert keys.known_hosts_files(str(tmp_path / "no-ssh"), [], "h", None, None) == []


def test_the_wrapper_is_installed_only_when_asked_and_once():
    keys = _host_keys_module()

    def connect(spec):
        return {"method": "ssh", "kwargs": _mitogen_kwargs()}

    class Module:
        CONNECTION_METHOD: ClassVar[dict] = {"ssh": connect, "smart": connect, "local": connect}

    keys.install(Module, {})
    assert Module.CONNECTION_METHOD["ssh"] is connect
    keys.install(Module, {"PROVISIONER_HOST_KEYS": "accept-new"})
    keys.install(Module, {"PROVISIONER_HOST_KEYS": "accept-new"})
    for name in ("ssh", "smart"):
        assert Module.CONNECTION_METHOD[name](object())["kwargs"]["check_host_keys"] == "accept"
        assert Module.CONNECTION_METHOD[name].__defaults__[0] is connect, "wrapped once"
    assert Module.CONNECTION_METHOD["local"] is connect


def test_the_run_tells_the_strategy_to_accept_new_keys_and_where_a_check_keeps_them(monkeypatch):
    monkeypatch.setenv("PROVISIONER_STATE_DIR", "/var/tmp/pv")
    mux = engine._Multiplexer()
    monkeypatch.setattr(engine.ssh, "_MUX", mux)
    try:
        assert "PROVISIONER_HOST_KEYS" not in engine._run_env(False, "site.yml", check=True)
        real = engine._run_env(True, "site.yml")
        assert real["PROVISIONER_HOST_KEYS"] == "accept-new" and "PROVISIONER_HOST_KEYS_SCRATCH" not in real
        check = engine._run_env(True, "site.yml", check=True)
        assert check["PROVISIONER_HOST_KEYS_SCRATCH"] == str(mux.directory())
    finally:
        mux.close()


MITOGEN_KEY = "Host key checking is enabled, and SSH reported an unrecognized or mismatching host key."


def test_a_key_never_recorded_is_not_called_changed():
    strict = engine.explain_unreachable("web1", MITOGEN_KEY)
    assert strict.startswith("web1: its SSH host key is not in known_hosts; pass --accept-new-host-keys")
    assert "ssh-keyscan" in strict and "ssh-keygen -R" in strict and "\n" not in strict
    plain = "No ED25519 host key is known for 10.1.1.2 and you have requested strict checking.\r\nHost key verification failed."
    line = engine.explain_unreachable("web1", plain)
    assert "changed" not in line and "--accept-new-host-keys" in line and "ssh-keyscan" in line
    # With first-seen keys accepted (Mitogen answers ssh's prompt), a refused key is another one.
    assert "changed since it was recorded" in engine.explain_unreachable("web1", MITOGEN_KEY, accept_new_host_keys=True)


def test_mitogens_password_prompt_is_a_refused_login():
    line = engine.explain_unreachable("web1", "SSH password was requested, but none specified")
    assert line.startswith("web1: SSH login was refused")


def test_an_unanswered_host_names_what_ssh_said_and_the_timeout():
    """Mitogen's message puts ssh's own words after its first line: they are the reason."""
    line = engine.explain_unreachable(
        "web1", "Task failed: EOF on stream; last 100 lines received:\nConnection timed out during banner exchange"
    )
    assert line.startswith("web1: unreachable (ssh: Connection timed out during banner exchange); check that it is up")
    assert f"--connect-timeout SECONDS (now {engine.connect_timeout()})" in line and "\n" not in line
    plain = engine.explain_unreachable("web1", "Failed to connect to the host via ssh: ssh: connect to host 10.1.1.2 port 22: No route to host")
    assert plain == (
        "web1: unreachable (Failed to connect to the host via ssh: ssh: connect to host 10.1.1.2 port 22: No route to host); "
        "check that it is up and that ansible_host/port are right"
    )
