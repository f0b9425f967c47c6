"""SIGINT or SIGTERM to the command stops its run as a whole: forwarded to the run's process
group, what left the group ended by the run's marker, exit code 130 and a line saying so.

The processes here are real: a stand-in for ansible-playbook started in a session of its own
(as ansible-runner's pexpect starts it) with the run's marker in its environment, which traps
SIGINT as ansible-playbook does. tests/integration/test_interrupt.py does the same to a real run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from provisioner import engine, render
from provisioner.errors import ExitCode, Interrupted
from provisioner.result import Result, interrupted
from provisioner.runs import HostResult, RunResult

# Writes READY, then on SIGINT writes the signal's number to its file and exits 99 (as ansible-playbook does).
TRAPS_SIGINT = """
import signal, sys, time
from pathlib import Path
def stop(signum, frame):
    Path(sys.argv[1]).write_text(str(signum))
    sys.exit(99)
signal.signal(signal.SIGINT, stop)
Path(sys.argv[1] + ".ready").write_text("")
while True:
    time.sleep(0.1)
"""
# Ignores SIGINT (started in a session of its own: as an ssh master that left the run's group).
DETACHED = """
import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGINT, signal.SIG_IGN)
Path(sys.argv[1] + ".ready").write_text("")
while True:
    time.sleep(0.1)
"""


def start(script: str, out: Path, marker: str) -> subprocess.Popen:
    env = {**os.environ, engine.RUN_MARKER_ENV: marker}
    proc = subprocess.Popen([sys.executable, "-c", script, str(out)], env=env, start_new_session=True)
    ready = out.with_name(out.name + ".ready")
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the stand-in did not start"
        time.sleep(0.05)
    return proc


def marked(prefix: str) -> list[int]:
    return [p.pid for p in psutil.process_iter() if p.pid != os.getpid() and engine._marked(p, prefix)]


@pytest.fixture
def handlers():
    """The command's signal handlers, as the CLI installs them for its whole run."""
    with engine.interruptible():
        yield engine._INTERRUPT
    engine._INTERRUPT.reset()


def test_a_signal_while_no_playbook_runs_stops_the_command(handlers):
    with pytest.raises(Interrupted) as caught:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler runs at the next bytecode; never reached
    assert caught.value.exit_code == ExitCode.INTERRUPTED == 130
    assert str(caught.value).startswith("interrupted by SIGTERM: ")
    assert engine.interrupted() == signal.SIGTERM
    with pytest.raises(Interrupted):
        handlers.check()  # and no playbook starts after it


def test_a_signal_during_a_run_goes_to_the_runs_group_and_what_left_it_is_ended(handlers, tmp_path: Path):
    marker = f"{os.getpid()}:20261203T000000-{os.getpid()}-site"
    run = start(TRAPS_SIGINT, tmp_path / "run", marker)
    detached = start(DETACHED, tmp_path / "detached", marker)
    other = start(DETACHED, tmp_path / "other", "1:another-command")  # not this command's: left alone
    try:
        handlers.running = True
        os.kill(os.getpid(), signal.SIGINT)  # to this process alone, as kill -INT PID does
        assert run.wait(timeout=30) == 99, "the run's leader got SIGINT and ended itself"
        assert (tmp_path / "run").read_text() == str(int(signal.SIGINT))
        assert engine.interrupted() == signal.SIGINT
        assert detached.poll() is None, "SIGINT ignored: still running"
        handlers.running = False
        assert engine.end_run_processes(grace=2) == 1
        assert detached.wait(timeout=10) is not None
        assert marked(f"{os.getpid()}:") == []
        assert other.poll() is None, "another command's process is not this run's"
    finally:
        for proc in (run, detached, other):
            proc.kill()
            proc.wait()


def test_a_second_signal_kills_the_run_without_waiting(handlers, tmp_path: Path):
    stubborn = start(DETACHED, tmp_path / "stubborn", f"{os.getpid()}:x")
    try:
        handlers.running = True
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
        assert stubborn.poll() is None, "it ignores SIGINT"
        os.kill(os.getpid(), signal.SIGTERM)
        assert stubborn.wait(timeout=30) == -signal.SIGKILL
        assert engine.interrupted() == signal.SIGINT, "the first signal is the one reported"
    finally:
        stubborn.kill()
        stubborn.wait()


def test_the_run_is_killed_once_the_grace_is_over(handlers, monkeypatch):
    assert handlers.cancel() is False, "no signal: the run goes on"
    handlers.running = True
    os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(engine.interrupt, "INTERRUPT_GRACE_SECONDS", 3600.0)
    assert handlers.cancel() is False, "within the grace ansible-playbook ends itself"
    monkeypatch.setattr(engine.interrupt, "INTERRUPT_GRACE_SECONDS", 0.0)
    assert handlers.cancel() is True, "then ansible-runner kills the run's group"


def interrupted_run() -> RunResult:
    host = HostResult("web1", ok=3, changed=1, task="Install the base packages")
    return RunResult("site.yml", False, 254, {"web1": host}, {}, [], Path("/tmp"), 4.0, interrupted=signal.SIGINT)


def test_an_interrupted_run_says_so_in_its_summary_errors_and_exit_code():
    run = interrupted_run()
    assert run.exit_code == ExitCode.INTERRUPTED
    assert run.errors[0].startswith("interrupted by SIGINT: stopped before the end")
    assert run.to_dict()["interrupted"] == "SIGINT"
    assert render.summary_title(run) == "site.yml on 1 host: 1 changed: interrupted by SIGINT, stopped before the end"


def test_a_command_interrupted_anywhere_ends_with_130_and_the_line_first():
    done = Result("up", None, ExitCode.OK, errors=("web1: something else",))
    assert interrupted(done, 0) is done
    result = interrupted(done, signal.SIGTERM)
    assert result.exit_code == ExitCode.INTERRUPTED
    assert result.errors[0].startswith("interrupted by SIGTERM: ") and result.errors[1] == "web1: something else"
    assert interrupted(result, signal.SIGTERM).errors == result.errors, "said once"
    assert result.envelope()["exit_code"] == 130
