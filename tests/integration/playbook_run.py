"""A playbook of the test's own, run with plain ansible-playbook against a lab server, as an
Ansible user would (the repository's ansible.cfg and roles, no CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from provisioner import lab

ROOT = Path(__file__).resolve().parents[2]
BINDIR = Path(sys.executable).parent


def run_playbook(
    server: lab.LabServer, tmp_path: Path, book: list, *args: str, timeout: int = 600, **variables: object
) -> subprocess.CompletedProcess:
    """BOOK (a list of plays) on SERVER with VARIABLES as extra vars and ARGS for ansible-playbook."""
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(book, sort_keys=False))
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(variables))
    env = {
        **os.environ,
        "PATH": f"{BINDIR}:{os.environ.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
    }
    return subprocess.run(
        [str(BINDIR / "ansible-playbook"), "-i", str(server.inventory), "-e", f"@{extra}", *args, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
