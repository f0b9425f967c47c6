# Copyright: provisioner contributors
# Apache License 2.0 (see pyproject.toml)
"""Action plugin: build code provisioner runs on a host into one zipapp, on the controller.

Builds with ``provisioner.zipapp`` (or ``provisioner.smoke.zipapp`` for the smoke test's target
half) into Ansible's local temporary directory and returns the archive's path, for
``ansible.builtin.script`` to run on a host or ``ansible.builtin.copy`` to install. The archive is
byte-reproducible (its name carries its sha256), so every host and every fork writes the same
file; nothing runs on the target, and it behaves the same in check mode.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: provisioner_zipapp
short_description: Build code for the hosts into one zipapp (controller side)
description:
  - Builds a byte-reproducible zipapp into Ansible's local temporary directory and returns its path.
    Makes no remote call; the same sources give the same bytes; C(changed) is always false.
  - With O(src), C(<name>-<sha12>.pyz) of a package directory's modules (its C(*.py), one level) and a
    top-level C(__main__.py) that runs the package's own C(__main__): role shared's drift check
    (C(files/provisioner_status)).
  - With O(smoke=true), C(provisioner_smoke-<sha12>.pyz), the smoke test's target half, the workloads and
    the layers below them, from the installed provisioner package.
options:
  src:
    description: A package directory on the controller; it must hold a C(__main__.py). Exclusive with O(smoke).
    type: path
  smoke:
    description: Build the smoke test's workloads instead of O(src).
    type: bool
    default: false
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
version:
  description: The provisioner package's version that built it.
  type: str
  returned: success
"""

import hashlib
import tempfile

from ansible import constants as C
from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

try:  # the provisioner package, installed on the control node (galaxy.yml)
    import provisioner
    from provisioner import zipapp
    from provisioner.smoke import zipapp as smoke_zipapp
except ImportError as exc:
    raise AnsibleError(f"provisioner_zipapp: pip install provisioner on the control node ({exc})") from exc


class ActionModule(ActionBase):
    # Runs on the controller only (ActionBase's defaults: no file transfer, check mode, no async).
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars or {})
        result["changed"] = False
        args = dict(self._task.args)
        src, smoke = args.pop("src", None), args.pop("smoke", False)
        wrong = ""
        if args:
            wrong = f"takes src or smoke, not: {', '.join(sorted(args))}"
        elif bool(src) == bool(smoke):
            wrong = "takes one of src (a package directory) and smoke: true"
        if wrong:
            result.update(failed=True, msg=f"provisioner_zipapp {wrong}")
            return result
        directory = C.DEFAULT_LOCAL_TMP or tempfile.gettempdir()
        if smoke:
            path = smoke_zipapp.build(directory)
        else:
            try:
                path = zipapp.build_package(src, directory)
            except FileNotFoundError as exc:
                result.update(failed=True, msg=f"provisioner_zipapp: {exc}: src must be a package directory with a __main__.py")
                return result
        result.update(path=str(path), sha256=hashlib.sha256(path.read_bytes()).hexdigest(), version=provisioner.__version__)
        return result
