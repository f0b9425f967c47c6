"""The hardware facts of the machines in tests/fixtures/facts (one JSON file each, as role
plan's facts module reports them), for the tests of what is derived from them."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


def load(name: str) -> dict:
    """The facts of the fixture machine NAME."""
    return json.loads((FIXTURES / f"{name}.json").read_text())
