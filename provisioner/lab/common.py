"""What every part of the lab shares: its error type, what the machine must have, one file writer."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from provisioner.errors import ProvisionerError

REQUIRED_TOOLS = (
    "systemd-nspawn",
    "mmdebstrap",
    "nsenter",
    "ip",
    "iptables",
    "ssh-keygen",
    "mount",
    "umount",
    "tar",
    "zstd",
    "ssh",
)


class LabError(ProvisionerError):
    """A lab server could not be built, started, reached or torn down."""


def missing_requirement() -> str | None:
    """What this machine lacks for lab servers (one line naming the fix), or None."""
    if os.geteuid() != 0:
        return "lab servers need root (overlay mounts, systemd-nspawn): run as root"
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        return (
            f"lab servers need {', '.join(missing)}: apt-get install systemd-container "
            "mmdebstrap iptables iproute2 openssh-client zstd"
        )
    return None


def check_environment() -> None:
    problem = missing_requirement()
    if problem:
        raise LabError(problem)


def write_file(path: Path, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` through a temporary name, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)
