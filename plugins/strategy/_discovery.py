"""Python discovery under Mitogen gives up on a host it cannot reach at the first try.

To run Ansible's interpreter discovery on a host, Mitogen needs a Python there already, so it
starts one by each name of INTERPRETER_PYTHON_FALLBACK in turn (python3.13 ... python3, eight
names) until one answers, each over a connection of its own. On a Debian 12 host the first two
are not found, which costs a fraction of a second each. On a host that does not answer, every
name waits out the whole connection timeout: an unreachable host was reported after 8 x 10 s.

install() keeps the loop for names that are not there and stops it at a failure that says the
host itself could not be reached (a timeout, ssh's own connection or login errors): the next
name would meet the same wall.
"""

from __future__ import annotations

from typing import Any

# Words of a failure that no other interpreter name would fix: the host did not answer, or ssh
# refused to log in (Mitogen's and ssh's own wording).
UNREACHABLE = (
    "Connection timed out",
    "timed out",
    "ssh: connect to host",
    "ssh: Could not resolve hostname",
    "No route to host",
    "Connection refused",
    "Permission denied",
    "Host key verification failed",
    "host key",
    "password was requested",
)


def unreachable(exc: BaseException) -> bool:
    """True when the failure says the host could not be reached, whatever Python was asked for."""
    text = str(exc)
    return any(words in text for words in UNREACHABLE)


def install(mixins: Any) -> None:
    """Wrap ansible_mitogen.mixins.ActionModuleMixin._low_level_execute_command (once)."""
    cls = mixins.ActionModuleMixin
    original = cls._low_level_execute_command
    if getattr(original, "_provisioner_discovery", False):
        return

    def _low_level_execute_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self, "_mitogen_discovering_interpreter", False):
            return original(self, *args, **kwargs)
        candidates = list(self._mitogen_interpreter_candidates or [])
        try:
            for i, candidate in enumerate(candidates):
                # Mitogen's own loop over one name: it raises that name's failure.
                self._mitogen_interpreter_candidates = [candidate]
                try:
                    return original(self, *args, **kwargs)
                except Exception as exc:
                    if i == len(candidates) - 1 or unreachable(exc):
                        raise
            return original(self, *args, **kwargs)  # no names at all: as Mitogen does
        finally:
            self._mitogen_interpreter_candidates = candidates

    _low_level_execute_command._provisioner_discovery = True  # type: ignore[attr-defined]
    cls._low_level_execute_command = _low_level_execute_command
