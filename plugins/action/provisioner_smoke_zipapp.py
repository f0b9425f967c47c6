# Copyright: provisioner contributors
# Apache License 2.0 (see pyproject.toml)
"""Action plugin: build the smoke test's target half, one zipapp, on the controller.

Calls ``provisioner.smoke.zipapp.build`` into Ansible's local temporary directory and returns the
archive's path for ``ansible.builtin.script`` to run on the host.  The archive is byte-reproducible
(its name carries its sha256), so every host and every fork writes the same file; nothing runs on
the target, and it behaves the same in check mode.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: provisioner_smoke_zipapp
short_description: Build the smoke test's workloads into one zipapp (controller side)
description:
  - Builds C(provisioner_smoke-<sha12>.pyz) from the installed provisioner package's
    provisioner/smoke (the target half, the workloads and the layers below them) into Ansible's
    local temporary directory, and returns its path. Makes no remote call.
  - The same sources give the same bytes; C(changed) is always false.
options: {}
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
  description: The provisioner package's version the archive was built from.
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
    from provisioner.smoke.zipapp import build
except ImportError as exc:
    raise AnsibleError(f"provisioner_smoke_zipapp: pip install provisioner on the control node ({exc})") from exc


class ActionModule(ActionBase):
    # Runs on the controller only (ActionBase's defaults: no file transfer, check mode, no async).
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars or {})
        result["changed"] = False
        if self._task.args:
            result.update(failed=True, msg=f"provisioner_smoke_zipapp takes no options, not: {', '.join(sorted(self._task.args))}")
            return result
        path = build(C.DEFAULT_LOCAL_TMP or tempfile.gettempdir())
        result.update(path=str(path), sha256=hashlib.sha256(path.read_bytes()).hexdigest(), version=provisioner.__version__)
        return result
