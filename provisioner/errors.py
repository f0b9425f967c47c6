"""Errors the CLI turns into one clear line and a documented exit code."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    HOST_FAILED = 1  # a task failed on at least one host
    BAD_INPUT = 2  # refused before any host was touched
    UNREACHABLE = 3  # at least one host could not be reached (network, auth, host key)
    INTERNAL = 4  # a bug or an environment problem on the control node


class ProvisionerError(Exception):
    """A problem with a one-line message that names the problem and the fix."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, exit_code: ExitCode | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class BadInput(ProvisionerError):
    exit_code = ExitCode.BAD_INPUT
