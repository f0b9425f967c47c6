"""Build hook: put the Ansible content into the wheel under provisioner/_content.

provisioner.paths looks there first, so an installed wheel (pip, pipx) finds its roles,
playbooks, inventories, plugins and the ML stack's lock. An editable install gets nothing
copied: it reads the source tree, and a copy would go stale.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

CONTENT = ("roles", "playbooks", "inventories", "plugins", "requirements", "ansible.cfg")


class ContentHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "editable":
            return
        root = Path(self.root)
        for name in CONTENT:
            files = [root / name] if (root / name).is_file() else sorted((root / name).rglob("*"))
            for path in files:
                if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                    build_data["force_include"][str(path)] = f"provisioner/_content/{path.relative_to(root)}"
