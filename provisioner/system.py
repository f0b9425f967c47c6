"""The control node's own system calls: one command runner and one file lock for every module."""

from __future__ import annotations

import contextlib
import fcntl
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .errors import ProvisionerError


def last_line(text: str | None) -> str:
    """The last non-empty line of a command's output (what a one-line error quotes)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run(
    cmd: Sequence[str],
    what: str,
    fix: str = "",
    *,
    error: type[ProvisionerError] = ProvisionerError,
    check: bool = True,
    timeout: float | None = None,
    **kwargs: Any,
) -> subprocess.CompletedProcess[str]:
    """Run a command with no stdin and captured text output.

    A command that cannot start, times out, or (with `check`) exits non-zero raises `error`
    with one line: `what`, the command's last line of output, and `fix` when given.
    """
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    kwargs.setdefault("capture_output", "stdout" not in kwargs and "stderr" not in kwargs)
    try:
        proc = subprocess.run(list(cmd), text=True, check=False, timeout=timeout, **kwargs)
    except OSError as exc:
        raise error(f"{what}: cannot run {cmd[0]} ({exc}); {fix or 'install it'}") from exc
    except subprocess.TimeoutExpired as exc:
        raise error(f"{what}: {cmd[0]} took longer than {timeout:.0f} s" + (f"; {fix}" if fix else "")) from exc
    if check and proc.returncode != 0:
        detail = last_line(proc.stderr) or last_line(proc.stdout) or f"exit {proc.returncode}"
        raise error(f"{what}: {detail}" + (f"; {fix}" if fix else ""))
    return proc


@contextlib.contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive fcntl lock on `lock_file` (created with its directory) for the block."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
