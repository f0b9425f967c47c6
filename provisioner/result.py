"""What every command returns: one result type, and one JSON envelope for every `--json`.

A command's orchestration function (provisioner.commands) returns a `Result`; the CLI only
prints it, as tables or as the envelope, and exits with its exit code:

    {"schema": 1, "command": "up", "exit_code": 0, "data": {...}, "messages": [...], "errors": [...]}

`data` is the command's own payload (the same for a command in every release of one schema);
`messages` are notes for the user (a reboot left to do, where the report was written);
`errors` are one-line problems (a failed task, an unreachable host), also printed to stderr.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from .errors import ExitCode, Interrupted, ProvisionerError, interrupted_message

# Bump when a key of the envelope, or of a command's data, changes meaning or goes away.
SCHEMA = 1


T = TypeVar("T")


@dataclass(frozen=True)
class Result(Generic[T]):
    """A command's outcome: its payload (`value`, rendered by the CLI), notes, errors, exit code."""

    command: str
    value: T
    exit_code: ExitCode = ExitCode.OK
    messages: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def data(self) -> Any:
        """The payload as JSON-ready data."""
        return to_data(self.value)

    def envelope(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "command": self.command,
            "exit_code": int(self.exit_code),
            "data": self.data,
            "messages": list(self.messages),
            "errors": list(self.errors),
        }


def refused(command: str, exc: ProvisionerError | Interrupted) -> Result[None]:
    """A command stopped by an error before it had anything to show (bad input, a control-node
    problem, a signal while no playbook ran)."""
    return Result(command, None, exc.exit_code, errors=(str(exc),))


def interrupted(result: Result[T], signum: int) -> Result[T]:
    """The result of a command that `signum` (SIGINT, SIGTERM) interrupted, wherever it came (in a
    run, between two, in verify): exit code 130 and, first among its errors, the line saying so."""
    if not signum:
        return result
    line = interrupted_message(signum)
    errors = result.errors if line in result.errors else (line, *result.errors)
    return replace(result, exit_code=ExitCode.INTERRUPTED, errors=errors)


def first_failure(codes: Iterable[int | None]) -> ExitCode:
    """The exit code of a chain of steps: the first step that did not succeed decides."""
    return next((ExitCode(c) for c in codes if c is not None and c != ExitCode.OK), ExitCode.OK)


def to_data(value: Any) -> Any:
    """JSON-ready data of a payload: objects by their to_dict, containers element by element."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: to_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_data(v) for v in value]
    return value
