"""Role shared's drift check (roles/shared/files/provisioner_status) imported as the zipapp runs it:
its package on sys.path, each module by name."""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "roles" / "shared" / "files" / "provisioner_status"
if str(PACKAGE.parent) not in sys.path:
    sys.path.insert(0, str(PACKAGE.parent))

from provisioner_status import cli, common, kernel, probes, report, sources  # noqa: E402

__all__ = ["PACKAGE", "cli", "common", "kernel", "probes", "report", "sources"]
