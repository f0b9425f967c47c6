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
