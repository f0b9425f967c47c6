"""Lint, format and type checks of the control-node package; lint and type checks of the collection's
plugins, of the scripts the roles copy to the targets and of the tests (configured in
pyproject.toml: mypy's files name what it checks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "cmd",
    [
        pytest.param(["ruff", "check", "provisioner", "hatch_build.py", "plugins", "roles", "tests"], id="ruff-check"),
        pytest.param(["ruff", "format", "--check", "provisioner", "hatch_build.py"], id="ruff-format"),
        pytest.param(["mypy"], id="mypy"),
    ],
)
def test_the_package_passes(cmd: list[str]) -> None:
    proc = subprocess.run([str(BIN / cmd[0]), *cmd[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}"
