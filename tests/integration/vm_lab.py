"""What the lab VM test modules share: the CLI's JSON envelope (with Mitogen: software emulation
makes every task slow), ssh into the VM, and one VM booted for a whole module with its times."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from provisioner import lab
from provisioner.lab.image import ensure_image

BIN = Path(sys.executable).parent / "provisioner"


def cli_json(*args: str, timeout: float = 2400) -> tuple[int, dict, list[str], list[str]]:
    """Exit code, data, errors and messages of the JSON envelope."""
    env = {**os.environ, "PROVISIONER_STRATEGY": "mitogen"}
    r = subprocess.run([str(BIN), *args, "--json"], capture_output=True, text=True, timeout=timeout, env=env)
    assert r.stdout.strip(), f"no JSON on stdout; stderr: {r.stderr}"
    envelope = json.loads(r.stdout)
    assert envelope["exit_code"] == r.returncode, envelope
    return r.returncode, envelope["data"], envelope["errors"], envelope["messages"]


def ssh(server: lab.LabServer, command: str, timeout: float = 300, check: bool = True) -> str:
    """COMMAND's stdout in the VM; with check, a non-zero exit fails the test with its output."""
    r = subprocess.run(
        ["ssh", "-F", str(server.ssh_config), server.name, command], capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0 or not check, f"{command}: {r.stdout}{r.stderr}"
    return r.stdout


@contextlib.contextmanager
def booted(name: str, times: dict[str, float], label: str, **options: object) -> Iterator[lab.LabServer]:
    """A lab VM for the module (lab.up_vm's options), its image built or cached first; TIMES gets
    the image's and the boot's seconds and is printed under LABEL when the VM is taken down."""
    start = time.monotonic()
    ensure_image()
    times["image (built or cached)"] = time.monotonic() - start
    start = time.monotonic()
    try:
        server = lab.up_vm(name, **options)
        times["boot to ssh"] = time.monotonic() - start
        yield server
    finally:
        lab.down(name)
        print(f"\n{label} (s): " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()))
