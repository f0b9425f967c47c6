"""The collection's module_utils files the control node shares with the modules (the plan's rules,
choice lists and limits): each is loaded by path from plugins/module_utils, so the control node
holds no second copy. Those files are executed, never imported as a package: they import nothing
of their own (see plugins/module_utils/provisioner_constants.py, provisioner_drive_rules.py)."""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType

from . import paths


@functools.cache
def load(name: str) -> ModuleType:
    """plugins/module_utils/NAME.py as a module, loaded once."""
    source = paths.PLUGINS / "module_utils" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, source)
    if spec is None or spec.loader is None:  # pragma: no cover - a broken install
        raise ImportError(f"cannot load {source}: reinstall provisioner")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
