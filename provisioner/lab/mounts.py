"""A lab server's root: an overlay (upper, work, merged) over the read-only rootfs, and the
host block devices bound into it."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

from provisioner.system import run

from .common import LabError


def parse_mountinfo(text: str) -> set[str]:
    """The mount points in a /proc/PID/mountinfo text (octal escapes such as \\040 decoded)."""
    points = set()
    for line in text.splitlines():
        raw = line.split()[4]
        points.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), raw))
    return points


def is_mounted(path: Path) -> bool:
    return str(path) in parse_mountinfo(Path("/proc/self/mountinfo").read_text())


def overlay_options(rootfs: Path, upper: Path, work: Path) -> str:
    return f"lowerdir={rootfs},upperdir={upper},workdir={work}"


def mount_overlay(rootfs: Path, root: Path) -> Path:
    """Mount ROOT/merged: ROOT/upper over `rootfs`; returns the merged dir."""
    upper, work, merged = root / "upper", root / "work", root / "merged"
    for d in (upper, work, merged):
        d.mkdir(parents=True, exist_ok=True)
    upper.chmod(0o755)  # becomes the server's "/" (independent of our umask)
    run(
        ["mount", "-t", "overlay", "overlay", "-o", overlay_options(rootfs, upper, work), str(merged)],
        f"overlay mount at {merged} failed",
        "check that the kernel has overlayfs and the lab dir is not on overlayfs itself",
        error=LabError,
    )
    return merged


def umount(merged: Path) -> None:
    """Unmount, retrying while busy, then lazily."""
    for _ in range(10):
        if not is_mounted(merged):
            return
        if run(["umount", str(merged)], f"cannot unmount {merged}", error=LabError, check=False).returncode == 0:
            return
        time.sleep(0.2)
    if is_mounted(merged):
        run(["umount", "-l", str(merged)], f"cannot unmount {merged}", "unmount it by hand", error=LabError)


def check_devices(devices: Sequence[str]) -> list[str]:
    """The block devices to bind into a server: each an absolute path that exists."""
    for dev in devices:
        if not dev.startswith("/") or not os.path.exists(dev):
            raise LabError(
                f"device {dev!r} for the lab server does not exist: pass an absolute path (e.g. from losetup -f --show)"
            )
    return list(devices)
