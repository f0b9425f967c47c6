"""Byte-reproducible zipapps: the code provisioner runs on a host as one file.

Two are built on the control node and shipped by Ansible: the smoke test's target half
(provisioner.smoke.zipapp) and role shared's drift check (a plain package directory,
roles/shared/files/provisioner_status, through the action plugin provisioner_zipapp).

Sorted entries, one fixed date, mode 0644, no compression (deflate's bytes depend on the zlib
version) and no __pycache__: the same sources give the same bytes, named by their sha256.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path

from provisioner import paths

DATE = (1980, 1, 1, 0, 0, 0)


def archive(entries: dict[str, bytes]) -> bytes:
    """The zipapp's bytes for ENTRIES (name in the archive -> bytes): the same entries, the same bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
        for name, data in sorted(entries.items()):
            info = zipfile.ZipInfo(name, DATE)
            info.create_system = 3  # unix, wherever it is built
            info.external_attr = 0o100644 << 16
            info.compress_type = zipfile.ZIP_STORED
            zf.writestr(info, data)
    return buffer.getvalue()


def package_entries(package: str | os.PathLike[str]) -> dict[str, bytes]:
    """A package directory's modules (PACKAGE/*.py, one level: subpackages are not taken), under the
    package's name (with an empty __init__.py where it has none), and a __main__.py at the archive's top that runs the package's own __main__."""
    package = Path(package)
    if not (package / "__main__.py").is_file():
        raise FileNotFoundError(f"{package}: not a package with a __main__.py")
    entries = {f"{package.name}/{p.name}": p.read_bytes() for p in sorted(package.glob("*.py"))}
    entries.setdefault(f"{package.name}/__init__.py", b"")  # zipimport finds no namespace package
    entries["__main__.py"] = f"import runpy\n\nrunpy.run_module({package.name!r}, run_name='__main__', alter_sys=True)\n".encode()
    return entries


def write(data: bytes, directory: str | os.PathLike[str], prefix: str, name: str | None = None) -> Path:
    """Write DATA into DIRECTORY as PREFIX<sha12>.pyz (or NAME) and return its path. Written beside and
    renamed: processes building the same archive at once never see half a file."""
    dest = Path(directory) / (name or f"{prefix}{hashlib.sha256(data).hexdigest()[:12]}.pyz")
    return paths.replace_file(dest, data, 0o644)


def build_package(package: str | os.PathLike[str], directory: str | os.PathLike[str]) -> Path:
    """A package directory's zipapp (package_entries) written into DIRECTORY as <name>-<sha12>.pyz."""
    return write(archive(package_entries(package)), directory, f"{Path(package).name}-")
