"""SIGINT or SIGTERM sent to the provisioner process alone (a supervisor, a CI cancel, kill -INT
PID: not a terminal's process group) stops its real playbook run as a whole.

The CLI runs in a session of its own, as under a supervisor, on a real run whose first module
task is slow: the host's Python interpreter is a script that sleeps before it starts Python (a
slow task that costs no CPU). Once ansible-runner reports the task started, the signal goes to
the CLI's PID only. The CLI must end with exit code 130, say "interrupted" (the summary or the
JSON envelope's first error) and leave no process of the run behind: none with the run's state
directory on its command line (ansible-playbook, its workers, ssh and its masters) and none
with the run's marker in its environment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from provisioner import engine, lab
from provisioner.errors import ExitCode

BIN = Path(sys.executable).parent / "provisioner"
MARKER = "provisioner-interrupt-test-sleeper"
SLOW_PYTHON = f"""#!/bin/sh
# A slow task: the interpreter sleeps before it starts.
/usr/bin/python3 -c 'import time; time.sleep(600)' {MARKER}
exec /usr/bin/python3 "$@"
"""
# Guards against a hung test, no speed limit: a busy 2-core machine starts ansible-playbook slowly.
STARTED_WITHIN_S = 300


def task_started(state: Path) -> bool:
    for events in (state / "runs" / "artifacts").glob("*/job_events/*.json"):
        try:
            if json.loads(events.read_text()).get("event") == "runner_on_start":
                return True
        except (OSError, ValueError):
            continue  # being written
    return False


def left_behind(cli_pid: int, state: Path) -> list[str]:
    """Processes of the run still alive: the state directory on their command line, or the marker
    of one of the CLI's runs in their environment."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            cmdline = " ".join(proc.cmdline())
            marked = proc.environ().get(engine.RUN_MARKER_ENV, "").startswith(f"{cli_pid}:")
        except psutil.Error:
            continue
        if str(state) in cmdline or marked:
            found.append(f"{proc.pid}: {cmdline}")
    return found


def sleepers() -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if MARKER in " ".join(p.info["cmdline"] or [])]


class Interrupted(subprocess.CompletedProcess[str]):
    """The CLI's result and its PID (the processes of its run carry the marker)."""

    def __init__(self, cli: subprocess.Popen[str], stdout: str, stderr: str) -> None:
        super().__init__(cli.args, cli.returncode, stdout, stderr)
        self.pid = cli.pid


def interrupt(args: list[str], state: Path, signum: int, env: dict[str, str] | None = None) -> Interrupted:
    """Start the CLI in a session of its own, wait until its first task runs, send `signum` to
    its PID alone and wait for it to end; the result's `pid` is the CLI's."""
    cli = subprocess.Popen(
        [str(BIN), *args],
        env={**os.environ, "PROVISIONER_STATE_DIR": str(state), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + STARTED_WITHIN_S
        while not task_started(state):
            assert cli.poll() is None, f"the run ended before its slow task: {cli.communicate()}"
            assert time.monotonic() < deadline, "the slow task never started"
            time.sleep(0.2)
        time.sleep(1)  # the task's processes under way
        assert left_behind(cli.pid, state), "the run's processes carry its marker"
        os.kill(cli.pid, signum)
        out, err = cli.communicate(timeout=engine.INTERRUPT_GRACE_SECONDS + 120)
    finally:
        if cli.poll() is None:  # the test failed: leave nothing behind either
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait()
    return Interrupted(cli, out, err)


def test_sigint_to_the_cli_alone_stops_a_local_run(tmp_path: Path):
    """Local connection, the run's own strategy (linear for facts.yml), the terminal summary."""
    slow = tmp_path / "slow-python"
    slow.write_text(SLOW_PYTHON)
    slow.chmod(0o755)
    inventory = tmp_path / "hosts.yml"
    host = {"ansible_connection": "local", "ansible_python_interpreter": str(slow)}
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"slow-local": host}}}))
    state = tmp_path / "state"

    done = interrupt(["facts", "-i", str(inventory)], state, signal.SIGINT)

    assert sleepers() == [], "the slow task on this machine ended with the run"
    assert done.returncode == ExitCode.INTERRUPTED == 130, done
    assert "facts.yml on 1 host: 1 ok: interrupted by SIGINT, stopped before the end" in done.stdout, done.stdout
    assert done.stderr.startswith("error: interrupted by SIGINT: stopped before the end"), done.stderr
    assert left_behind(done.pid, state) == [], "a process of the run outlived the CLI"


@pytest.mark.lab
def test_sigterm_to_the_cli_alone_stops_a_run_over_ssh_under_mitogen(lab_server: lab.LabServer, tmp_path: Path):
    """Over ssh to the shared lab server, Mitogen's strategy (its multiplexer and ssh children,
    the ssh masters that leave the run's process group), the JSON envelope."""
    remote = f"/tmp/{MARKER}-python"
    subprocess.run(
        ["ssh", "-F", str(lab_server.ssh_config), lab_server.name, f"cat > {remote} && chmod 755 {remote}"],
        input=SLOW_PYTHON,
        text=True,
        check=True,
        timeout=60,
    )
    inv = yaml.safe_load(lab_server.inventory.read_text())
    for host in inv["all"]["children"]["lab"]["hosts"].values():
        host["ansible_python_interpreter"] = remote
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump(inv))
    state = tmp_path / "state"
    try:
        done = interrupt(["facts", "-i", str(inventory), "--json"], state, signal.SIGTERM, {"PROVISIONER_STRATEGY": "mitogen"})
    finally:
        subprocess.run(
            ["ssh", "-F", str(lab_server.ssh_config), lab_server.name, f"pkill -f {MARKER}; rm -f {remote}"],
            timeout=60,
            check=False,
        )

    assert done.returncode == ExitCode.INTERRUPTED, done
    envelope = json.loads(done.stdout)
    assert envelope["exit_code"] == 130
    assert envelope["errors"][0].startswith("interrupted by SIGTERM: stopped before the end"), envelope
    assert left_behind(done.pid, state) == [], "a process of the run outlived the CLI"
