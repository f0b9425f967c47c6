"""Lab server fixtures: disposable Debian 12 servers (systemd-nspawn) for integration tests.

- `lab_server` (session): one shared server named "pv-test", booted once, torn down at
  the end of the session. Tests must not leave it in a state that breaks other tests.
- `fresh_lab_server` (function): a factory `make(name, devices=())` for throwaway
  servers; every server it made is torn down after the test.

Both depend on `lab_requirements` (tests/conftest.py): skip, or fail under the test script,
naming the missing piece.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest

from provisioner import lab

SHARED_NAME = "pv-test"


@pytest.fixture(scope="session")
def lab_server(lab_requirements: None) -> Iterator[lab.LabServer]:
    """The shared lab server "pv-test" (booted once per session)."""
    try:
        server = lab.up(SHARED_NAME)
        yield server
    finally:
        lab.down(SHARED_NAME)


@pytest.fixture
def fresh_lab_server(lab_requirements: None) -> Iterator[Callable[..., lab.LabServer]]:
    """Factory for throwaway lab servers: make(name, devices=()) -> LabServer."""
    made: list[str] = []

    def make(name: str, devices: Sequence[str] = ()) -> lab.LabServer:
        made.append(name)
        return lab.up(name, devices=devices)

    try:
        yield make
    finally:
        errors = []
        for name in reversed(made):
            try:
                lab.down(name)
            except lab.LabError as exc:
                errors.append(str(exc))
        if errors:
            raise lab.LabError("; ".join(errors))
