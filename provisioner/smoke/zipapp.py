"""The smoke test's target half as one archive: a byte-reproducible zipapp of the workload code.

Built on the control node (the action plugin provisioner_zipapp, smoke: true) and run on a host by the
system Python (`python3 provisioner_smoke-<sha12>.pyz run ...`), as root; the parent then runs
the same archive with the ML environment's Python for each worker. It holds:

- a `__main__.py` that only calls provisioner.smoke.target.parent.main: a zip's __main__ is not
  re-run by multiprocessing's spawn children, so nothing else may live there;
- provisioner/__init__.py as it is (the version), and a docstring-only provisioner/smoke/__init__.py
  instead of the real one, which pulls in the judgement, the store and the report's helpers;
- provisioner/smoke/base.py, hardware.py, workloads/*.py and target/*.py, and provisioner/tune/*.py
  (the host half of `provisioner tune`): the standard library at their top, nothing else
  (tests/unit/test_smoke_zipapp.py holds them to it).

Reproducible as every zipapp provisioner ships (provisioner.zipapp): the same sources give the
same bytes, named by their sha256.
"""

from __future__ import annotations

import os
from pathlib import Path

from provisioner import zipapp

PACKAGE = Path(__file__).resolve().parents[1]  # provisioner/
MAIN = (
    '"""provisioner smoke: measure what the ML workloads get from this machine (see provisioner.smoke.target)."""\n\n'
    "from provisioner.smoke.target.parent import main\n\n"
    "raise SystemExit(main())\n"
)
SMOKE_STUB = (
    '"""The smoke test\'s target half (provisioner.smoke.target), the workloads and the layers below them:\n'
    'the control node\'s judgement is not shipped."""\n'
)
PREFIX = "provisioner_smoke-"
# The host half of `provisioner tune` (the control node's write-back and proposal are not shipped).
HOST_TUNE = ("__init__.py", "driver.py", "knobs.py", "live.py", "pairs.py")


def sources(package: Path = PACKAGE) -> dict[str, bytes]:
    """The archive's entries: its name -> its bytes."""
    smoke = package / "smoke"
    files = [package / "__init__.py", smoke / "base.py", smoke / "hardware.py"]
    files += sorted((smoke / "workloads").glob("*.py")) + sorted((smoke / "target").glob("*.py"))
    files += [package / "tune" / f for f in HOST_TUNE]
    entries = {f"provisioner/{p.relative_to(package).as_posix()}": p.read_bytes() for p in files}
    entries["provisioner/smoke/__init__.py"] = SMOKE_STUB.encode()
    entries["__main__.py"] = MAIN.encode()
    return entries


def archive(package: Path = PACKAGE) -> bytes:
    """The zipapp's bytes: the same sources give the same bytes."""
    return zipapp.archive(sources(package))


def build(directory: str | os.PathLike[str], name: str | None = None) -> Path:
    """Write the zipapp into directory as provisioner_smoke-<sha12>.pyz (or name) and return its path."""
    return zipapp.write(archive(), directory, PREFIX, name)
