"""roles/smoke/files/provisioner_smoke.py, the script the smoke role runs on a host, as a module
(standard library only), for the tests of its parts."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

PATH = Path(__file__).resolve().parents[2] / "roles" / "smoke" / "files" / "provisioner_smoke.py"


def load() -> ModuleType:
    """A fresh copy of the script: a test may patch it."""
    spec = importlib.util.spec_from_file_location("provisioner_smoke", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
