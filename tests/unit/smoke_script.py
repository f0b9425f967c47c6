"""provisioner/smoke/target/parent.py, what the smoke role runs on a host (from the zipapp
provisioner.smoke.zipapp builds), as a fresh module for the tests of its parts."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

PATH = Path(__file__).resolve().parents[2] / "provisioner" / "smoke" / "target" / "parent.py"


def load() -> ModuleType:
    """A fresh copy of the target's parent: a test may patch it. Named as the package names it, so
    its relative imports and what pickles it by name find the package."""
    spec = importlib.util.spec_from_file_location("provisioner.smoke.target.parent", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
