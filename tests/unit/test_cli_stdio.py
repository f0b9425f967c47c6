"""A terminal left non-blocking (by an ssh that was killed) no longer stops every run: ansible
refuses non-blocking stdio, and the CLI makes it blocking again before it starts."""

from __future__ import annotations

import subprocess
import sys

from playbook_cases import BINDIR, ROOT, local_env

LEAVE_NON_BLOCKING = "import os, sys; os.set_blocking(0, False); os.execv(sys.argv[1], sys.argv[1:])"


def test_ansible_refuses_a_non_blocking_stdin_and_the_cli_repairs_it():
    # The stdin pipe's flag is shared by the processes that hold it, as a killed ssh leaves it.
    ansible = subprocess.run(
        [sys.executable, "-c", LEAVE_NON_BLOCKING, str(BINDIR / "ansible-inventory"), "-i", "localhost,", "--list"],
        stdin=subprocess.PIPE, capture_output=True, text=True, env=local_env(), cwd=ROOT, check=False, timeout=120,
    )
    assert ansible.returncode != 0 and "requires blocking IO" in ansible.stdout + ansible.stderr
    cli = subprocess.run(
        [sys.executable, "-c", LEAVE_NON_BLOCKING, str(BINDIR / "provisioner"), "plan", "-i", "inventories/local", "--json"],
        stdin=subprocess.PIPE, capture_output=True, text=True, env=local_env(), cwd=ROOT, check=False, timeout=300,
    )
    assert "requires blocking IO" not in cli.stdout + cli.stderr, cli.stdout[-2000:] + cli.stderr[-2000:]
    assert cli.returncode == 0, cli.stdout[-2000:] + cli.stderr[-2000:]
