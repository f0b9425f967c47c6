"""Forks sized from the inventory and memory; SSH masters in a private, short directory that the
command closes when it ends."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

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
    monkeypatch.setattr(engine, "_MUX", mux)
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
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}", str(play)],
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
    monkeypatch.setattr(engine, "_MUX", mux)
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
