"""The read-only Debian 12 rootfs a lab server's overlay sits on: built with mmdebstrap from
the host's apt sources, cached as a tarball, extracted once. Two flavours: the lab's own
(python3-apt in, apt's daily timers masked) and "fresh", as a minimal install leaves a server
(minbase plus what a login and Ansible need: no python3-apt, no lsb-release, no /etc/hosts)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from provisioner import paths
from provisioner.system import locked, run

from .common import LabError, check_environment

SUITE = "bookworm"
VARIANT = "minbase"
INCLUDE: tuple[str, ...] = (
    "python3",
    "python3-apt",
    "openssh-server",
    "systemd-sysv",
    "dbus",
    "iproute2",
    "procps",
    "ca-certificates",
)
# Host keys made by openssh-server's postinst would be shared by every server: drop them,
# each server gets its own at `up`.
CUSTOMIZE_HOOKS: tuple[str, ...] = (
    'rm -f "$1"/etc/ssh/ssh_host_*',
    # apt's daily timers would take the dpkg lock at random moments after boot: a role's apt
    # task then waits for it and can report a change where there was none.
    'ln -sf /dev/null "$1"/etc/systemd/system/apt-daily.timer',
    'ln -sf /dev/null "$1"/etc/systemd/system/apt-daily-upgrade.timer',
)

# "fresh": a server as the smallest installers leave it. Nothing the product installs itself
# (python3-apt), nothing masked; the host keys and /etc/hosts go, each server makes its own
# keys at `up` as a fresh install does at first boot.
FRESH_INCLUDE: tuple[str, ...] = tuple(p for p in INCLUDE if p != "python3-apt")
FRESH_HOOKS: tuple[str, ...] = ('rm -f "$1"/etc/ssh/ssh_host_*', 'rm -f "$1"/etc/hosts')


@dataclass(frozen=True)
class Flavour:
    name: str
    include: tuple[str, ...]
    hooks: tuple[str, ...]
    prefix: str  # of the cached tarball and directory: SUITE-KEY for the lab's own, SUITE-fresh-KEY


LAB = Flavour("lab", INCLUDE, CUSTOMIZE_HOOKS, SUITE)
FRESH = Flavour("fresh", FRESH_INCLUDE, FRESH_HOOKS, f"{SUITE}-fresh")


def flavour(fresh: bool) -> Flavour:
    return FRESH if fresh else LAB


HOST_SOURCES_LIST = Path("/etc/apt/sources.list")
HOST_SOURCES_DIR = Path("/etc/apt/sources.list.d")
HOST_APT_CONF_DIR = Path("/etc/apt/apt.conf.d")


def host_sources() -> list[Path]:
    """The host's apt sources files for SUITE (passed to mmdebstrap as its mirrors)."""
    candidates = [HOST_SOURCES_LIST] if HOST_SOURCES_LIST.is_file() else []
    if HOST_SOURCES_DIR.is_dir():
        candidates += sorted(p for p in HOST_SOURCES_DIR.iterdir() if p.suffix in (".list", ".sources"))
    chosen = [p for p in candidates if re.search(rf"(?m)^[^#]*\b{SUITE}\b", p.read_text())]
    if not chosen:
        raise LabError(
            f"no apt source for {SUITE} in {HOST_SOURCES_LIST} or {HOST_SOURCES_DIR}: "
            "the lab reuses the host's Debian 12 apt sources, add one"
        )
    return chosen


def host_acquire_confs() -> list[Path]:
    """Host apt.conf.d files with Acquire settings (proxy, Check-Valid-Until, ...).

    Files with hook commands (*-Invoke) are left out: they call host programs.
    """
    if not HOST_APT_CONF_DIR.is_dir():
        return []
    chosen = []
    for path in sorted(HOST_APT_CONF_DIR.iterdir()):
        text = path.read_text(errors="replace") if path.is_file() else ""
        if "Acquire" in text and "Invoke" not in text:
            chosen.append(path)
    return chosen


def rootfs_key(sources: Sequence[str], aptopts: Sequence[str], kind: Flavour = LAB) -> str:
    """Hash of everything that decides the rootfs content (the texts of the sources and apt options)."""
    recipe = {
        "suite": SUITE,
        "variant": VARIANT,
        "include": sorted(kind.include),
        "hooks": list(kind.hooks),
        "sources": list(sources),
        "aptopts": list(aptopts),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def mmdebstrap_cmd(target: Path, sources: Sequence[Path], aptopts: Sequence[Path], kind: Flavour = LAB) -> list[str]:
    cmd = ["mmdebstrap", f"--variant={VARIANT}", f"--include={','.join(kind.include)}"]
    cmd += [f"--aptopt={p}" for p in aptopts]
    cmd += [f"--customize-hook={hook}" for hook in kind.hooks]
    return [*cmd, SUITE, str(target), *(str(p) for p in sources)]


def _build_tarball(tarball: Path, kind: Flavour) -> None:
    """mmdebstrap into a temporary name, then rename atomically."""
    partial = tarball.with_name(f".partial-{os.getpid()}-{tarball.name}")
    log = tarball.with_name(tarball.name.removesuffix(".tar.zst") + ".build.log")
    try:
        with open(log, "w") as out:
            run(
                mmdebstrap_cmd(partial, host_sources(), host_acquire_confs(), kind),
                "building the lab rootfs with mmdebstrap failed",
                f"see {log}",
                error=LabError,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        os.replace(partial, tarball)
    finally:
        partial.unlink(missing_ok=True)


def _extract(tarball: Path, rootfs: Path) -> None:
    """Extract into a temporary dir, then rename atomically."""
    partial = rootfs.with_name(f".partial-{os.getpid()}-{rootfs.name}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(mode=0o755)
    try:
        run(
            [
                "tar",
                "--zstd",
                "-xpf",
                str(tarball),
                "-C",
                str(partial),
                "--numeric-owner",
                "--xattrs",
                "--xattrs-include=*",
            ],
            f"extracting {tarball} failed",
            "delete it and retry",
            error=LabError,
        )
        os.replace(partial, rootfs)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def ensure_rootfs(fresh: bool = False) -> Path:
    """The extracted, read-only lab rootfs (the fresh-install one with FRESH); built and
    extracted once, then cached."""
    check_environment()
    kind = flavour(fresh)
    cache = paths.cache_dir()
    key = rootfs_key([p.read_text() for p in host_sources()], [p.read_text() for p in host_acquire_confs()], kind)
    tarball = cache / f"{kind.prefix}-{key}.tar.zst"
    rootfs = cache / f"{kind.prefix}-{key}"
    if rootfs.is_dir():
        return rootfs
    with locked(cache / ".rootfs.lock"):
        if not tarball.is_file():
            _build_tarball(tarball, kind)
        if not rootfs.is_dir():
            _extract(tarball, rootfs)
    return rootfs
