"""The CLI as the integration tests on container lab servers run it: the installed `provisioner`
with its JSON envelope, and ssh into a lab server through the lab's own ssh_config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent / "provisioner"


def cli(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    # A guard against a hung run, not a speed limit: a full first `up` (every role, the ML stack
    # installed) took 10 minutes on a busy 2-core machine.
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=timeout)


def cli_json(*args: str) -> tuple[int, dict]:
    """The exit code and the command's data, from the JSON envelope every command prints."""
    r = cli(*args, "--json")
    output = f"exit {r.returncode}\nstdout:\n{r.stdout[-20000:]}\nstderr:\n{r.stderr[-5000:]}"
    assert r.stdout.strip(), f"no JSON on stdout\n{output}"
    envelope = json.loads(r.stdout)
    assert envelope["schema"] == 1 and envelope["command"] == args[0], envelope
    assert envelope["exit_code"] == r.returncode, envelope
    return r.returncode, envelope["data"]


def ssh(server, command: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-F", str(server.ssh_config), server.name, command], capture_output=True, text=True, timeout=timeout
    )
