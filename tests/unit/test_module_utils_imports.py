"""How the collection's modules and module_utils import each other: by absolute name only.

Mitogen's module finder (the default strategy of `provisioner up`) ships a module's module_utils
by following absolute `ansible.module_utils.X` / `ansible_collections...module_utils.X` imports;
a relative import (`from .provisioner_common import ...`) is not followed, and the module fails
on the host with "No module named 'ansible.module_utils.provisioner_common'" while Ansible's own
strategies (AnsiballZ) pass. This file keeps that from coming back."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
FILES = sorted([*PLUGINS.glob("module_utils/*.py"), *PLUGINS.glob("modules/*.py")])


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_relative_import(path: Path) -> None:
    relative = [
        f"line {node.lineno}: from {'.' * node.level}{node.module or ''} import ..."
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level
    ]
    assert relative == [], relative
