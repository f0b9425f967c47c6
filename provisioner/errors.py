"""Errors the CLI turns into one clear line and a documented exit code."""

from __future__ import annotations

import signal
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    HOST_FAILED = 1  # a task failed on at least one host
    BAD_INPUT = 2  # refused with no change on any host (docs: README, exit codes)
    UNREACHABLE = 3  # at least one host could not be reached (network, auth, host key)
    INTERNAL = 4  # a bug or an environment problem on the control node
    # SIGINT or SIGTERM stopped the command (the shell's code for SIGINT, 128 + 2): every
    # process of its runs ended before it did, a host may hold part of a run's changes.
    INTERRUPTED = 130


class ProvisionerError(Exception):
    """A problem with a one-line message that names the problem and the fix."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, exit_code: ExitCode | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class BadInput(ProvisionerError):
    exit_code = ExitCode.BAD_INPUT


def interrupted_message(signum: int) -> str:
    """The one line an interrupted command ends with: what happened, and what to do."""
    name = signal.Signals(signum).name
    return (
        f"interrupted by {name}: stopped before the end, every process of the run has ended; "
        "a host may hold part of the run's changes: run the same command again to finish"
    )


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived while no playbook ran (the engine forwards it to a run instead):
    raised from the signal handler, as Python's own KeyboardInterrupt is, so that code catching
    Exception does not swallow it."""

    exit_code = ExitCode.INTERRUPTED

    def __init__(self, signum: int):
        super().__init__(interrupted_message(signum))
        self.signum = signum
