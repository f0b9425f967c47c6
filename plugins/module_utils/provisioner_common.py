# Copyright: provisioner contributors
# Apache License 2.0 (see pyproject.toml)
"""Helpers the provisioner modules share: files below a root, numbers, commands, mount tables.

Runs on the target inside the modules (standard library only, any python3 ansible-core
supports there); the unit tests import it on the control node.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess


def path_in(root, path):
    """``path`` (absolute) inside ``root``."""
    return os.path.join(root, path.lstrip("/"))


def read_text(root, path, default=None):
    """The text of ``path`` below ``root``, or ``default`` when it cannot be read."""
    try:
        with open(path_in(root, path), encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return default


def read_line(root, path, default=None):
    """The stripped text of a one-value file (sysfs, procfs), or ``default`` when empty or unreadable."""
    text = read_text(root, path)
    if text is None:
        return default
    text = text.strip()
    return text if text else default


def to_int(value, default=None):
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


def run(argv, timeout=60):
    """Run a command found on PATH (no shell, no stdin); None when it is missing or cannot run."""
    executable = shutil.which(argv[0])
    if executable is None:
        return None
    try:
        return subprocess.run(
            [executable, *argv[1:]],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
            text=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None


def unescape_octal(text):
    """Mount tables write space, tab, newline and backslash as octal escapes (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text):
    """/proc/self/mountinfo -> [{"majmin", "mountpoint", "fstype", "source"}]."""
    mounts = []
    for line in (text or "").splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or not tail:
            continue
        mounts.append(
            {
                "majmin": fields[2],
                "mountpoint": unescape_octal(fields[4]),
                "fstype": tail[0],
                "source": unescape_octal(tail[1]) if len(tail) > 1 else "",
            }
        )
    return mounts
