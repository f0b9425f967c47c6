"""Where provisioner finds its Ansible content and keeps its state."""

from __future__ import annotations

import os
from pathlib import Path

# The Ansible content (roles/, playbooks/, inventories/) lives beside the package.
HOME = Path(os.environ.get("PROVISIONER_HOME", Path(__file__).resolve().parent.parent))
ROLES = HOME / "roles"
PLAYBOOKS = HOME / "playbooks"
INVENTORIES = HOME / "inventories"
LOCAL_INVENTORY = INVENTORIES / "local" / "hosts.yml"


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
