"""Shared by the drift check's modules: its constants, bad input, and reading files and commands."""

from __future__ import annotations

import os
import re
import subprocess

SCHEMA = 1
EXPECTED_DIR = "/etc/provisioner/expected"
PLAN_FILE = "/etc/provisioner/plan.json"
TEXTFILE_NAME = "provisioner_status.prom"
BAD_INPUT = 2
OK, DRIFTED, NOT_APPLICABLE = "ok", "drifted", "not applicable"
CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# systemd-sysctl's directories, highest priority first (a file name in an earlier directory
# hides the same name in a later one); all files are then applied in file-name order.
SYSCTL_DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d", "/lib/sysctl.d")
SYSCTL_CONF = "/etc/sysctl.conf"
HUGEPAGE_KIB = {"2M": 2048, "1G": 1048576}
CPUFREQ = "/sys/devices/system/cpu/cpufreq"
TIMEOUT = 60
UNSET = "(unset)"
DOCTOR_TIMEOUT = 300


class BadInput(Exception):
    """An expected file that cannot be read or makes no sense; names the file. `fix` says what
    `provisioner up` does about it (every expected file is written by a run)."""

    def __init__(self, reason: str, fix: str = "write it again") -> None:
        super().__init__(reason)
        self.fix = fix


# ---------------------------------------------------------------- reading files and commands


def read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def run(argv: list[str], timeout: float = TIMEOUT, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """(returncode, stdout, stderr); 127 with the reason when it could not run. The command's
    environment is ENV, else a clean PATH and LANG only."""
    try:
        r = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=env if env is not None else {"PATH": CLEAN_PATH, "LANG": "C.UTF-8"},
        )
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not installed"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, "", f"{argv[0]}: {exc}"
    return r.returncode, r.stdout, r.stderr


def words(value: str) -> str:
    """A value as sysctl prints it: runs of blanks (tabs in /proc/sys) as one space."""
    return " ".join(value.split())


def parse_env(text: str) -> dict[str, str]:
    """The output of env(1): NAME=value lines (a value's later lines are left out)."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            env[name] = value
    return env


def systemd_is_pid1(root: str = "/") -> bool:
    comm = read(os.path.join(root, "proc/1/comm")) or ""
    return comm.strip() == "systemd" and os.path.isdir(os.path.join(root, "run/systemd/system"))
