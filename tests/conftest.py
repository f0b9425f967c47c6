"""Shared test set-up."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def lab_requirements() -> None:
    """Skip lab tests where lab servers cannot run, naming what is missing.

    With PROVISIONER_REQUIRE_LAB=1 (the test script sets it) a missing piece fails
    instead: there, a skip would hide a broken install.
    """
    from provisioner import lab

    reason = lab.missing_requirement()
    if reason and os.environ.get("PROVISIONER_REQUIRE_LAB") == "1":
        pytest.fail(f"lab servers are required here but unavailable: {reason}")
    if reason:
        pytest.skip(reason)


# The files that share the lab server pv-test, and tests/host (it changes live kernel values
# that lab servers see), run on one worker, in order; everything else (the molecule scenarios,
# the tests with servers of their own, the unit tests) is spread over the other workers.
SHARED_LAB = ("test_lab.py", "test_storage.py", "test_up.py", "test_host_tuning.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SHARED_LAB:
            item.add_marker(pytest.mark.xdist_group("shared-lab"))
