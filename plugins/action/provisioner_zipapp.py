# Copyright: provisioner contributors
# Apache License 2.0 (see pyproject.toml)
"""Action plugin: build a package directory into one zipapp on the controller.

Calls ``provisioner.zipapp`` into Ansible's local temporary directory and returns the archive's
path, for ``ansible.builtin.script`` to run on a host or ``ansible.builtin.copy`` to install. The
archive is byte-reproducible (its name carries its sha256), so every host and every fork writes
the same file; nothing runs on the target, and it behaves the same in check mode.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: provisioner_zipapp
short_description: Build a package directory into one zipapp (controller side)
description:
  - Builds C(<name>-<sha12>.pyz) from the modules of the package directory O(src) (its C(*.py), one
    level) and a top-level C(__main__.py) that runs the package's own C(__main__), into Ansible's
    local temporary directory, and returns its path. Makes no remote call.
  - The same sources give the same bytes; C(changed) is always false.
  - Role shared's drift check (C(files/provisioner_status)) is built with it.
options:
  src:
    description: The package directory on the controller; it must hold a C(__main__.py).
    type: path
    required: true
author:
  - provisioner contributors
"""

RETURN = r"""
path:
  description: The zipapp on the controller.
  type: str
  returned: success
sha256:
  description: The archive's sha256.
  type: str
  returned: success
"""

import hashlib
import tempfile

from ansible import constants as C
from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

try:  # the provisioner package, installed on the control node (galaxy.yml)
    from provisioner import zipapp
except ImportError as exc:
    raise AnsibleError(f"provisioner_zipapp: pip install provisioner on the control node ({exc})") from exc


class ActionModule(ActionBase):
    # Runs on the controller only (ActionBase's defaults: no file transfer, check mode, no async).
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars or {})
        result["changed"] = False
        extra = sorted(set(self._task.args) - {"src"})
        src = self._task.args.get("src")
        if extra or not src:
            wrong = f"takes only src, not: {', '.join(extra)}" if extra else "needs src, the package directory"
            result.update(failed=True, msg=f"provisioner_zipapp {wrong}")
            return result
        try:
            entries = zipapp.package_entries(src)
        except FileNotFoundError as exc:
            result.update(failed=True, msg=f"provisioner_zipapp: {exc}: src must be a package directory with a __main__.py")
            return result
        name = str(src).rstrip("/").rsplit("/", 1)[-1]
        path = zipapp.write(zipapp.archive(entries), C.DEFAULT_LOCAL_TMP or tempfile.gettempdir(), f"{name}-")
        result.update(path=str(path), sha256=hashlib.sha256(path.read_bytes()).hexdigest())
        return result
