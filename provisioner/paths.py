"""Where provisioner finds its Ansible content and keeps its state."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _home() -> Path:
    """The Ansible content: PROVISIONER_HOME, else inside an installed wheel (`_content/`),
    else the source tree the package sits in."""
    env = os.environ.get("PROVISIONER_HOME")
    if env:
        return Path(env)
    package = Path(__file__).resolve().parent
    bundled = package / "_content"
    return bundled if (bundled / "roles").is_dir() else package.parent


HOME = _home()
ROLES = HOME / "roles"
PLAYBOOKS = HOME / "playbooks"
INVENTORIES = HOME / "inventories"
LOCAL_INVENTORY = INVENTORIES / "local" / "hosts.yml"
# Modules, module_utils, action and filter plugins, laid out as in an Ansible collection.
PLUGINS = HOME / "plugins"
REQUIREMENTS = HOME / "requirements"


def state_dir() -> Path:
    """Run artifacts and per-host results; PROVISIONER_STATE_DIR overrides."""
    env = os.environ.get("PROVISIONER_STATE_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/provisioner")
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "provisioner"


def lab_dir() -> Path:
    """Lab servers (overlay dirs, keys, inventories); PROVISIONER_LAB_DIR overrides."""
    return Path(os.environ.get("PROVISIONER_LAB_DIR", state_dir() / "lab"))


def cache_dir() -> Path:
    """Cached lab root filesystems; PROVISIONER_CACHE_DIR overrides."""
    return Path(os.environ.get("PROVISIONER_CACHE_DIR", "/var/cache/provisioner"))


def replace_file(dest: Path, data: bytes, mode: int | None = None) -> Path:
    """Write DATA to DEST beside it and rename it into place: a reader never sees half a file. MODE
    sets its mode; without it an existing DEST keeps its mode and owner (a new one gets 0644)."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if mode is None and dest.exists():
            st = dest.stat()
            os.chmod(tmp, st.st_mode & 0o7777)
            if os.geteuid() == 0:  # only root can give a file to another owner
                os.chown(tmp, st.st_uid, st.st_gid)
        else:
            os.chmod(tmp, 0o644 if mode is None else mode)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest
