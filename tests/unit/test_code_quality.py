"""Lint, format and type checks of the control-node package; lint and type checks of the collection's
plugins, of the scripts the roles copy to the targets and of the tests (configured in
pyproject.toml: mypy's files name what it checks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner import paths

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def mypy_cache() -> list[str]:
    """mypy's incremental cache in this machine's cache directory (paths.cache_dir(), beside the lab's
    root filesystems and the wheelhouse), when it can be written there: a clean clone then checks only what differs
    from the last checked code (mypy takes a cached module whose content hash matches, wherever its
    file now lies, and checks again every module that changed and each that depends on one). On this
    2-core machine a cold check took 56 s and a clean clone's with the cache 3 s."""
    where = paths.cache_dir() / "mypy"
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError:
        return []  # mypy's own .mypy_cache in the checkout
    return ["--cache-dir", str(where)] if os.access(where, os.W_OK) else []


@pytest.mark.parametrize(
    "cmd",
    [
        pytest.param(["ruff", "check", "provisioner", "hatch_build.py", "plugins", "roles", "tests"], id="ruff-check"),
        pytest.param(["ruff", "format", "--check", "provisioner", "hatch_build.py"], id="ruff-format"),
        pytest.param(["mypy", *mypy_cache()], id="mypy"),
    ],
)
def test_the_package_passes(cmd: list[str]) -> None:
    proc = subprocess.run([str(BIN / cmd[0]), *cmd[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}"
