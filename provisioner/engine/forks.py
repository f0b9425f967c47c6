"""How many hosts a run works on at once (ansible-playbook's forks)."""

from __future__ import annotations

from ..errors import BadInput

# Forks: one per host, bounded by the control node's memory. Each fork is a copy of
# ansible-playbook (AWX sizes its capacity the same way: 100 MiB per fork once 2 GiB are kept
# back for the rest of the machine); PROVISIONER_FORKS overrides.
FORK_MEMORY_BYTES = 100 * 2**20
RESERVED_MEMORY_BYTES = 2 * 2**30
FORKS_ENV = "PROVISIONER_FORKS"


def forks_for(hosts: int, available_memory: int | None = None, override: str | None = None) -> int:
    """Parallel hosts for a run: every host at once, as far as the control node's memory
    allows; `override` (PROVISIONER_FORKS) wins, a positive whole number or refused."""
    if override is not None and override.strip():
        if not override.strip().isdigit() or int(override) < 1:
            raise BadInput(f"{FORKS_ENV}={override!r} is not a positive whole number: set it to 1 or more, or unset it")
        return int(override)
    if available_memory is None:
        import psutil

        available_memory = int(psutil.virtual_memory().available)
    bound = max(1, (available_memory - RESERVED_MEMORY_BYTES) // FORK_MEMORY_BYTES)
    return max(1, min(hosts, bound))
