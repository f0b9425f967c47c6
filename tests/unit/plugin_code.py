"""Import the repository's Ansible modules and plugins (plugins/) in tests, as Ansible does.

Modules import their shared code as ``ansible.module_utils.provisioner_*``; Ansible finds it
through ``module_utils`` (ansible.cfg, the CLI), the tests through the same directory.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import ansible.module_utils

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"

if str(PLUGINS / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(PLUGINS / "module_utils"))


def load(kind: str, name: str) -> ModuleType:
    """plugins/KIND/NAME.py as a module (kind: modules, action, filter, module_utils)."""
    spec = importlib.util.spec_from_file_location(name, PLUGINS / kind / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
