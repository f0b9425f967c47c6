#!/usr/bin/env python3
"""provisioner-status: the expected vs the live value of every setting the roles manage.

    provisioner_status.py [--expected-dir /etc/provisioner/expected] [--plan /etc/provisioner/plan.json]
                          [--json] [--textfile DIR]

Each role that manages a host setting declares, at the end of its run, what it expects in
EXPECTED_DIR/ROLE.json: {"schema": 1, "role": ROLE, "checks": [CHECK, ...]}, a CHECK being a
mapping with "name", "probe", "expected" and the probe's own keys. This script reads the
live value of each check with its probe and says ok, drifted (with both values) or not
applicable (with the reason). It changes nothing on the host.

Probes: sysctl (the live value where the role applied it, and always the value systemd-sysctl
applies at boot), thp, login_env, service_env, tuned, governor, epp, hugepages, mount, md and
doctor (mlstack-doctor --json).

Exit status: 0 when nothing drifted, 1 when something did, 2 on bad input (the expected
directory or a file in it cannot be read; a host never provisioned has no expected directory):
the reason on stderr, or with --json as {"schema", "host", "error", "fix"} on stdout. With
--textfile DIR it also writes DIR/provisioner_status.prom for node_exporter's textfile
collector, atomically.

Runs as root with the system Python and the standard library only (prometheus_client is used
for the textfile when it is importable); shipped by role shared.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import pwd
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

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


# ---------------------------------------------------------------- sysctl as systemd-sysctl applies it


def sysctl_files(root: str = "/") -> list[str]:
    """The files systemd-sysctl reads at boot, in the order it applies them, then
    /etc/sysctl.conf (procps' sysctl --system reads it last; Debian links it in as
    /etc/sysctl.d/99-sysctl.conf, and a file is read only once). A link to /dev/null masks."""
    chosen: dict[str, str] = {}
    for directory in SYSCTL_DIRS:
        base = os.path.join(root, directory.lstrip("/"))
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            path = os.path.join(base, name)
            if name.endswith(".conf") and name not in chosen and (os.path.isfile(path) or _masked(path)):
                chosen[name] = path
    files = [chosen[name] for name in sorted(chosen) if not _masked(chosen[name])]
    conf = os.path.join(root, SYSCTL_CONF.lstrip("/"))
    if os.path.isfile(conf) and os.path.realpath(conf) not in {os.path.realpath(f) for f in files}:
        files.append(conf)
    return files


def _masked(path: str) -> bool:
    return os.path.islink(path) and os.path.realpath(path) == "/dev/null"


def sysctl_key(key: str) -> str:
    """systemd's spelling rules: '/' and '.' both separate, a leading '-' ignores errors."""
    key = key.strip().lstrip("-")
    if "/" in key and not key.startswith("/"):
        key = key.replace("/", ".")
    return key


def parse_sysctl(text: str) -> list[tuple[str, str]]:
    """(key, value) assignments in file order; comments (# and ;) and blank lines left out."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, _, value = line.partition("=")
        out.append((sysctl_key(key), words(value)))
    return out


def persisted_sysctl(key: str, files: Iterable[str]) -> tuple[str | None, str | None]:
    """(value, file) of the last assignment of KEY over FILES; (None, None) when none sets it."""
    value = source = None
    for path in files:
        for k, v in parse_sysctl(read(path) or ""):
            if k == key:
                value, source = v, path
    return value, source


# ---------------------------------------------------------------- THP, tmpfiles.d, cpufreq, hugepages


def thp_selected(text: str | None) -> str | None:
    """The [selected] word of a THP file such as 'always [madvise] never'."""
    m = re.search(r"\[([^\]]+)\]", text or "")
    return m.group(1) if m else None


def tmpfiles_value(text: str, path: str) -> str | None:
    """The argument of the last w/w-/w+ line for PATH in a tmpfiles.d file."""
    value = None
    for line in text.splitlines():
        fields = line.split(None, 6)
        if len(fields) == 7 and fields[0].startswith("w") and fields[1] == path:
            value = fields[6].strip()
    return value


def cpufreq_values(name: str, root: str = "/") -> dict[str, str]:
    """policyN -> the value of NAME for every cpufreq policy that has the file."""
    base = os.path.join(root, CPUFREQ.lstrip("/"))
    out = {}
    try:
        policies = sorted((p for p in os.listdir(base) if re.fullmatch(r"policy\d+", p)), key=lambda p: int(p[6:]))
    except OSError:
        return {}
    for policy in policies:
        value = read(os.path.join(base, policy, name))
        if value is not None:
            out[policy] = value.strip()
    return out


# ---------------------------------------------------------------- md arrays and mounts


def parse_mdstat(text: str) -> dict[str, dict[str, Any]]:
    """/proc/mdstat -> {md127: {active, level, members, failed, slots, up, degraded}}."""
    arrays: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        m = re.match(r"^(md\w+)\s*:\s*(\S+)\s*(.*)$", line)
        if m:
            name, state, rest = m.groups()
            fields = [f for f in rest.split() if not f.startswith("(")]  # (auto-read-only), (read-only)
            level = fields[0] if fields and "[" not in fields[0] else None
            members, failed = [], []
            for f in fields:
                dm = re.match(r"^([^\[\s]+)\[(\d+)\](\((\w)\))?$", f)
                if dm:
                    members.append(dm.group(1))
                    if dm.group(4) == "F":
                        failed.append(dm.group(1))
            current = arrays[name] = {
                "active": state == "active",
                "state": state,
                "level": level,
                "members": members,
                "failed": failed,
                "slots": None,
                "up": None,
                "degraded": bool(failed),
            }
            continue
        if current is not None and line.strip():
            s = re.search(r"\[(\d+)/(\d+)\]\s*\[([U_]+)\]", line)
            if s:
                current["slots"] = f"[{s.group(1)}/{s.group(2)}]"
                current["up"] = s.group(3)
                current["degraded"] = current["degraded"] or "_" in s.group(3) or s.group(1) != s.group(2)
            r = re.search(r"\brecovery\s*=\s*([\d.]+%)", line)
            if r:  # only while the kernel rebuilds a member
                current["recovery"] = r.group(1)
        elif not line.strip():
            current = None
    return arrays


def describe_md(name: str, array: dict[str, Any], expected_members: Iterable[str] = ()) -> str:
    parts = [array["state"]] + ([array["level"]] if array["level"] else [])
    if array["slots"]:
        parts.append(f"{array['slots']} [{array['up']}]")
    text = " ".join(parts)
    problems = [f"{m} failed" for m in array["failed"]]
    problems += [f"{m} missing" for m in expected_members if m not in array["members"]]
    if array["degraded"] and not problems:
        problems.append("a member is missing")
    if recovering(array):
        text += f" recovering {array['recovery']}: the lost member is being rebuilt"
    elif array["degraded"]:
        text += " degraded: " + ", ".join(problems)
    return f"{name} {text}"


def recovering(array: dict[str, Any]) -> bool:
    """A degraded array rebuilding its missing member (every slot taken, none failed): it heals itself."""
    return bool(array["degraded"] and array.get("recovery") and not array["failed"])


def parse_mountinfo(text: str) -> list[dict[str, str]]:
    """/proc/self/mountinfo -> [{mountpoint, fstype, source, options}] in mount order."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        a, b = left.split(), right.split()
        if not sep or len(a) < 5 or len(b) < 2:
            continue
        unescape = lambda s: re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)  # noqa: E731
        out.append(
            {"mountpoint": unescape(a[4]), "options": a[5] if len(a) > 5 else "", "fstype": b[0], "source": unescape(b[1])}
        )
    return out


def device_uuid(source: str) -> str | None:
    """The filesystem UUID of a block device: udev's /dev/disk/by-uuid links, else blkid."""
    real = os.path.realpath(source)
    try:
        for name in os.listdir("/dev/disk/by-uuid"):
            if os.path.realpath(os.path.join("/dev/disk/by-uuid", name)) == real:
                return name
    except OSError:
        pass
    rc, out, _ = run(["blkid", "-p", "-s", "UUID", "-o", "value", source], timeout=10)
    return out.strip() or None if rc == 0 else None


# ---------------------------------------------------------------- where a drifted variable is set
#
# A drifted thread variable is not always provisioner's to repair: a file of the user's
# (/etc/profile.d/zz-mine.sh, ~/.profile, a systemd drop-in) may set it after the role's file.
# `provisioner up` rewrites only its own files, so the status names the file and the line that
# set the live value, and says whether a run can repair it.

# The first lines of every file a role writes from a template say so; a block a role keeps in
# a shared file (pam_env.conf) sits between "# BEGIN provisioner ..." and "# END provisioner ...".
MANAGED_MARK = "Managed by provisioner"
# systemd's manager configuration: the main file, then the drop-ins of these directories by
# file name (a name in an earlier directory hides the same name in a later one).
SYSTEM_CONF = "/etc/systemd/system.conf"
SYSTEM_CONF_DIRS = (
    "/etc/systemd/system.conf.d",
    "/run/systemd/system.conf.d",
    "/usr/local/lib/systemd/system.conf.d",
    "/usr/lib/systemd/system.conf.d",
)
# bash's xtrace with a PS4 that prints, before each command, the shell's PID, the PID of the
# process running it (a subshell's assignments do not last), the file and line, and the value
# of each variable (${VAR@Q}: quoted on one line, empty when unset).
TRACE_SEP = "\x1f"
TRACE_MARK = "provisioner-trace"
_TRACE_LINE = re.compile(r"^\++" + TRACE_SEP + re.escape(TRACE_MARK) + TRACE_SEP)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\+?=")
_DECLARE = frozenset({"export", "declare", "typeset", "readonly", "local"})
Source = dict[str, Any]  # {"file", "line", "managed_by_provisioner"} or {"file": None, "how", ...}


def trace_ps4(names: list[str]) -> str:
    fields = ["${$}", "${BASHPID}", "${BASH_SOURCE-}", "${LINENO}", *(f"${{{n}@Q}}" for n in names)]
    return "+" + TRACE_SEP + TRACE_MARK + TRACE_SEP + TRACE_SEP.join(fields) + TRACE_SEP


def emulated_login(names: list[str]) -> str:
    """A `bash --noprofile --norc -c` script that reads the files a login shell reads, in its
    order, traced. For root only: bash takes no PS4 from the environment when it runs as root."""
    return (
        f"PS4={shlex.quote(trace_ps4(names))}; set -x; "
        "if [ -r /etc/profile ]; then . /etc/profile; fi; "
        'if [ -f "$HOME/.bash_profile" ]; then . "$HOME/.bash_profile"; '
        'elif [ -f "$HOME/.bash_login" ]; then . "$HOME/.bash_login"; '
        'elif [ -f "$HOME/.profile" ]; then . "$HOME/.profile"; fi; true'
    )


def login_trace(user: str, names: list[str], uid: int, home: str) -> tuple[list[str], dict[str, str]]:
    """The command and environment that trace a login shell of USER (the trace on stderr).
    Another user's: the login shell the login_env probe starts (runuser -l, bash), with PS4 and
    SHELLOPTS=xtrace let through, so the trace starts before /etc/profile. root's: emulated_login."""
    base = {"PATH": CLEAN_PATH, "LANG": "C.UTF-8"}
    if uid != 0:
        argv = ["runuser", "-l", user, "-s", "/bin/bash", "-w", "PS4,SHELLOPTS", "-c", "true"]
        return argv, {**base, "PS4": trace_ps4(names), "SHELLOPTS": "xtrace"}
    env = {**base, "HOME": home, "USER": user, "LOGNAME": user, "SHELL": "/bin/bash"}
    return ["/bin/bash", "--noprofile", "--norc", "-c", emulated_login(names)], env


def assigns(command: str, name: str) -> bool:
    """Whether a traced command sets or unsets NAME when it runs (`NAME=v`, `export NAME=v`,
    `declare -x NAME=v`, `unset NAME`, `read NAME`, `printf -v NAME`). `NAME=v cmd` is traced
    as a row `NAME=v` of its own (see parse_trace). Assignments that leave no trace in the text
    (`: ${NAME:=v}`) are found by the value changing instead."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return False
    if not argv:
        return False
    if argv[0] in _DECLARE:
        return any((m := _ASSIGNMENT.match(w)) is not None and m.group(1) == name for w in argv[1:])
    if argv[0] in ("unset", "read"):
        return name in argv[1:]
    if argv[0] == "printf":
        return any(a == "-v" and b == name for a, b in itertools.pairwise(argv))
    matches = [_ASSIGNMENT.match(w) for w in argv]
    return all(matches) and any(m is not None and m.group(1) == name for m in matches)


def _last_setter(rows: list[list[str]], k: int, name: str) -> int | None:
    """The index of the row that gave the variable its final value (see parse_trace).

    bash prints a command's trace after expanding its words and before running it, with PS4
    expanded then: a statement `NAME=v` shows the old value on its own row and the new one on
    the next; `: ${NAME:=v}` shows the new value on its own row (the expansion assigned it);
    `NAME=v cmd` is traced as a row `NAME=v` already showing v, then the row of cmd, and the
    old value comes back after it (a temporary assignment, left out here)."""
    values = [r[4 + k] for r in rows]
    commands = [r[-1] for r in rows]
    temporary = [False] * len(rows)
    i = 1
    while i < len(rows):
        if values[i] != values[i - 1] and assigns(commands[i], name) and _ASSIGNMENT.match(commands[i].strip()):
            before, j = values[i - 1], i
            while j < len(rows) and values[j] != before:
                values[j], temporary[j] = before, True
                j += 1
            i = j
        i += 1
    final = values[-1]
    changed = None
    for j in range(len(rows) - 1, 0, -1):
        if values[j - 1] != final:
            # the change came between rows j-1 and j: the run of j-1, or the expansion of j
            changed = j - 1 if assigns(commands[j - 1], name) else j
            break
    assigned = None
    for j in range(len(rows) - 1, -1, -1):
        if not temporary[j] and assigns(commands[j], name) and (j + 1 == len(rows) or values[j + 1] == final):
            assigned = j
            break
    found = [j for j in (changed, assigned) if j is not None]
    return max(found) if found else None


def parse_trace(text: str, names: list[str]) -> dict[str, tuple[str, int, str] | None]:
    """NAME -> (file, line, command) of the last command of the login shell itself that gave
    NAME its final value (set, changed or unset it); None when none did (the value came with
    the environment the shell started with). {} when TEXT holds no trace at all (not bash)."""
    rows = []
    for line in text.splitlines():
        m = _TRACE_LINE.match(line)
        if not m:
            continue
        parts = line[m.end() :].split(TRACE_SEP, 4 + len(names))
        if len(parts) == 5 + len(names) and parts[3].isdigit():
            rows.append(parts)
    if not rows:
        return {}
    shell = rows[-1][0]  # the last command is the login shell's own `true`
    rows = [r for r in rows if r[0] == shell and r[1] == shell]  # a subshell's assignments do not last
    found: dict[str, tuple[str, int, str] | None] = {}
    for k, name in enumerate(names):
        j = _last_setter(rows, k, name)
        found[name] = (rows[j][2], int(rows[j][3]), rows[j][-1].strip()) if j is not None and rows[j][2] else None
    return found


def managed_by_provisioner(text: str, line: int) -> bool:
    """Whether LINE of a file with TEXT is provisioner's: the file says it is managed, or the
    line is inside a "# BEGIN provisioner" block."""
    lines = text.splitlines()
    if any(MANAGED_MARK in head for head in lines[:5]):
        return True
    inside = False
    for n, content in enumerate(lines, 1):
        if content.startswith("# BEGIN provisioner"):
            inside = True
        elif content.startswith("# END provisioner"):
            inside = False
        elif n == line:
            return inside
    return False


def file_source(path: str, line: int, root: str = "/") -> Source:
    text = read(os.path.join(root, path.lstrip("/"))) or ""
    return {"file": path, "line": line, "managed_by_provisioner": managed_by_provisioner(text, line)}


def manager_conf_files(root: str = "/") -> list[str]:
    """The systemd manager's configuration files in the order it reads them (a link to
    /dev/null masks a drop-in)."""
    files = [SYSTEM_CONF] if os.path.isfile(os.path.join(root, SYSTEM_CONF.lstrip("/"))) else []
    chosen: dict[str, str] = {}
    for directory in SYSTEM_CONF_DIRS:
        try:
            names = os.listdir(os.path.join(root, directory.lstrip("/")))
        except OSError:
            continue
        for name in names:
            if name.endswith(".conf") and name not in chosen:
                chosen[name] = os.path.join(directory, name)
    return files + [chosen[n] for n in sorted(chosen) if not _masked(os.path.join(root, chosen[n].lstrip("/")))]


def default_environment(var: str, files: list[str], root: str = "/") -> tuple[str | None, str | None, int | None]:
    """(value, file, line) of the DefaultEnvironment= assignment of VAR that holds after FILES
    (later assignments win, an empty DefaultEnvironment= clears them); (None, None, None) when none."""
    value: str | None = None
    where: tuple[str | None, int | None] = (None, None)
    for path in files:
        section = ""
        for n, raw in enumerate((read(os.path.join(root, path.lstrip("/"))) or "").splitlines(), 1):
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line
                continue
            key, sep, assigned = line.partition("=")
            if section != "[Manager]" or not sep or key.strip() != "DefaultEnvironment":
                continue
            if not assigned.strip():
                value, where = None, (None, None)
                continue
            try:
                items = shlex.split(assigned)
            except ValueError:
                continue
            for item in items:
                name, eq, v = item.partition("=")
                if eq and name == var:
                    value, where = v, (path, n)
    return value, where[0], where[1]


def describe_source(source: Source, var: str) -> str:
    """Where the value comes from, and what repairs it."""
    if source.get("file") is None:
        return (
            f"set at run time in the systemd manager (systemctl set-environment), not by a file: "
            f"`systemctl unset-environment {var}` removes it; `provisioner up` cannot repair it"
        )
    where = f"set by {source['file']} line {source['line']}"
    if source["managed_by_provisioner"]:
        return f"{where}, provisioner's own file, changed since the run wrote it: `provisioner up` writes it again"
    return f"{where}, not by provisioner: remove or change that line; `provisioner up` cannot repair it"


# ---------------------------------------------------------------- the probes

Reading = tuple[str | None, str, str]  # (live value, state, reason)


class Probes:
    """One instance per run: environments read once are shared by the checks that need them."""

    def __init__(self, root: str = "/") -> None:
        self.root = root
        self._login: dict[str, dict[str, str] | str] = {}
        self._service: dict[str, str] | str | None = None
        self._sysctl_files: list[str] | None = None
        self._doctor: dict[str, tuple[int, str, str]] = {}
        self._login_sources: dict[str, dict[str, tuple[str, int, str] | None]] = {}
        self._manager_files: list[str] | None = None
        # Every check of the run (measure_all sets it): a login shell is traced once for all
        # the variables its user's checks name.
        self.checks: list[dict[str, Any]] = []

    def path(self, p: str) -> str:
        return os.path.join(self.root, p.lstrip("/"))

    def measure(self, check: dict[str, Any]) -> Reading:
        probe = getattr(self, "probe_" + check["probe"])
        result: Reading = probe(check, str(check.get("expected", "")))
        return result

    # sysctl
    def probe_sysctl(self, check: dict[str, Any], expected: str) -> Reading:
        key = sysctl_key(check["key"])
        if self._sysctl_files is None:
            self._sysctl_files = sysctl_files(self.root)
        boot, source = persisted_sysctl(key, self._sysctl_files)
        readings, problems = [], []
        if check.get("live", False):
            raw = read(self.path("/proc/sys/" + key.replace(".", "/")))
            live = words(raw) if raw is not None else None
            readings.append(f"live {live if live is not None else '(missing)'}")
            if live != words(expected):
                problems.append(f"the running kernel has {live if live is not None else 'no ' + key}")
        readings.append(f"at boot {boot if boot is not None else '(not set)'}" + (f" ({source})" if source else ""))
        if boot != words(expected):
            problems.append(f"at boot {boot} from {source}" if boot is not None else f"no sysctl.d file sets {key}")
        if problems:
            return "; ".join(readings), DRIFTED, "; ".join(problems)
        return boot, OK, ""

    # THP
    def probe_thp(self, check: dict[str, Any], expected: str) -> Reading:
        path = check["path"]
        if check.get("live", True):
            raw = read(self.path(path))
            if raw is None:
                return None, NOT_APPLICABLE, f"not applicable: no {path} (a kernel without THP)"
            live = thp_selected(raw)
            return compare(live, expected, f"{path} selects {live}")
        persisted = check.get("persisted_file", "")
        text = read(self.path(persisted))
        if text is None:
            return None, DRIFTED, f"{persisted} is gone (THP is read-only here: the value is persisted for the boot)"
        value = tmpfiles_value(text, path)
        return compare(value, expected, f"{persisted} writes {value if value is not None else 'nothing'} to {path}")

    # login shell and service environments
    def probe_login_env(self, check: dict[str, Any], expected: str) -> Reading:
        user = check["user"]
        if user not in self._login:
            rc, out, err = run(["runuser", "-l", user, "-c", "env"])
            self._login[user] = parse_env(out) if rc == 0 else f"runuser -l {user} exited {rc}: {err.strip()[:200]}"
        env = self._login[user]
        if isinstance(env, str):
            return None, DRIFTED, env
        live = env.get(check["var"], UNSET)
        return compare(
            live,
            expected,
            f"a login shell of {user} has {check['var']}={live}"
            if live != UNSET
            else f"a login shell of {user} has no {check['var']}",
        )

    def probe_service_env(self, check: dict[str, Any], expected: str) -> Reading:
        if not systemd_is_pid1(self.root):
            return None, NOT_APPLICABLE, "not applicable: systemd is not PID 1"
        if self._service is None:
            argv = ["systemd-run", "--wait", "--pipe", "--quiet", "--collect", "/usr/bin/env"]
            rc, out, err = run(argv)
            self._service = parse_env(out) if rc == 0 else f"systemd-run exited {rc}: {err.strip()[:200]}"
        if isinstance(self._service, str):
            return None, DRIFTED, self._service
        live = self._service.get(check["var"], UNSET)
        return compare(
            live, expected, f"a service has {check['var']}={live}" if live != UNSET else f"a service has no {check['var']}"
        )

    # where a drifted value comes from
    def source(self, check: dict[str, Any], live: str | None) -> Source | None:
        """The file and line that set a drifted variable's live value (login shells, services);
        None when unknown or for other probes. Never fails the run: a source is a hint."""
        try:
            if check["probe"] == "login_env":
                return self._login_source(check["user"], check["var"])
            if check["probe"] == "service_env":
                return self._service_source(check["var"], live)
        except (OSError, KeyError, ValueError):
            return None
        return None

    def _login_source(self, user: str, var: str) -> Source | None:
        if var not in self._login_sources.get(user, {}):
            names = sorted({c["var"] for c in self.checks if c.get("probe") == "login_env" and c.get("user") == user} | {var})
            names = [n for n in names if _NAME.match(n)]
            entry = pwd.getpwnam(user)
            argv, env = login_trace(user, names, entry.pw_uid, entry.pw_dir)
            _, out, err = run(argv, env=env)
            self._login_sources[user] = parse_trace(err + "\n" + out, names)
        found = self._login_sources[user].get(var)
        return file_source(found[0], found[1], self.root) if found else None

    def _service_source(self, var: str, live: str | None) -> Source | None:
        if self._manager_files is None:
            self._manager_files = manager_conf_files(self.root)
        value, path, line = default_environment(var, self._manager_files, self.root)
        live_value = None if live in (None, UNSET) else live
        if path is not None and line is not None and value == live_value:
            return file_source(path, line, self.root)
        if live_value is not None and value != live_value:
            return {"file": None, "line": None, "how": "systemctl set-environment", "managed_by_provisioner": False}
        return None

    # tuned
    def probe_tuned(self, check: dict[str, Any], expected: str) -> Reading:
        profile_dir = check.get("profile_dir")
        if profile_dir and not os.path.isdir(self.path(profile_dir)):
            return None, DRIFTED, f"the profile's directory {profile_dir} is gone"
        if not systemd_is_pid1(self.root):
            return None, NOT_APPLICABLE, "not applicable: systemd is not PID 1 (tuned is not driven here)"
        rc, out, err = run(["tuned-adm", "active"])
        m = re.search(r"^Current active profile:\s*(\S+)", out, re.M)
        if m:
            live: str | None = m.group(1)
            how = "tuned-adm active"
        elif rc == 127:
            live, how = (read(self.path("/etc/tuned/active_profile")) or "").strip() or None, "/etc/tuned/active_profile"
        else:
            detail = (out + err).strip().splitlines()
            return "none", DRIFTED, "tuned-adm active: " + (detail[0] if detail else f"exit {rc}")
        return compare(live, expected, f"{how}: {live if live else 'no profile'}")

    # cpufreq
    def probe_governor(self, check: dict[str, Any], expected: str) -> Reading:
        return self._cpufreq("scaling_governor", check, expected)

    def probe_epp(self, check: dict[str, Any], expected: str) -> Reading:
        return self._cpufreq("energy_performance_preference", check, expected)

    def _cpufreq(self, name: str, check: dict[str, Any], expected: str) -> Reading:
        if not os.path.isdir(self.path("/sys/devices/system/cpu/cpu0/cpufreq")):
            return None, NOT_APPLICABLE, "not applicable: no cpufreq driver"
        values = cpufreq_values(name, self.root)
        if not values:
            return None, NOT_APPLICABLE, f"not applicable: the cpufreq driver has no {name}"
        if not check.get("live", True):
            return None, NOT_APPLICABLE, f"not applicable: {name} is not set live here (read-only or not offered)"
        seen = sorted(set(values.values()))
        live = seen[0] if len(seen) == 1 else ", ".join(f"{p}={v}" for p, v in values.items())
        wrong = [p for p, v in values.items() if v != expected]
        if wrong:
            return live, DRIFTED, f"{name} differs on {len(wrong)} of {len(values)} cpufreq policies ({', '.join(wrong)})"
        return live, OK, ""

    # hugepages
    def probe_hugepages(self, check: dict[str, Any], expected: str) -> Reading:
        size = check["size"]
        if size == "2M" and not check.get("live", True):
            if self._sysctl_files is None:
                self._sysctl_files = sysctl_files(self.root)
            boot, source = persisted_sysctl("vm.nr_hugepages", self._sysctl_files)
            return compare(
                boot,
                expected,
                f"at boot vm.nr_hugepages={boot} from {source}"
                if source
                else "no sysctl.d file sets vm.nr_hugepages (vm.* is read-only here: persisted for the boot)",
            )
        raw = read(self.path(f"/sys/kernel/mm/hugepages/hugepages-{HUGEPAGE_KIB[size]}kB/nr_hugepages"))
        if raw is None:
            return None, NOT_APPLICABLE, f"not applicable: the kernel offers no {size} pages"
        live = raw.strip()
        if size == "1G" and live != expected:
            want = f"hugepagesz=1G hugepages={expected}"
            cmdline = f" {(read(self.path('/proc/cmdline')) or '').strip()} "
            if f" {want} " not in cmdline:
                return live, NOT_APPLICABLE, f"reboot pending: the running kernel booted without '{want}'"
        return compare(live, expected, f"{live} {size} pages reserved")

    # the data mount and its array
    def probe_mount(self, check: dict[str, Any], expected: str) -> Reading:
        path = check["path"].rstrip("/") or "/"
        mounts = [m for m in parse_mountinfo(read(self.path("/proc/self/mountinfo")) or "") if m["mountpoint"] == path]
        if not mounts:
            return "not mounted", DRIFTED, f"nothing is mounted at {path}"
        top = mounts[-1]
        live = top["fstype"]
        problems, note = [], ""
        if check.get("fstype") and top["fstype"] != check["fstype"]:
            problems.append(f"{path} is {top['fstype']}, not {check['fstype']}")
        if check.get("uuid"):
            found = self._mount_uuid(top, check["uuid"])
            live += f" UUID={found}" if found else " UUID unknown"
            if found and found != check["uuid"]:
                problems.append(f"{path} has UUID {found}, not {check['uuid']}")
            elif not found:
                # No udev links and no blkid here (a container): no evidence either way.
                note = f"the UUID of {top['source']} cannot be read here: only the filesystem type was checked"
        live += f" ({top['source']})"
        return (live, DRIFTED, "; ".join(problems)) if problems else (live, OK, note)

    def _mount_uuid(self, mount: dict[str, str], expected: str) -> str | None:
        # A mounted btrfs (one filesystem over several drives) is /sys/fs/btrfs/UUID.
        if mount["fstype"] == "btrfs" and os.path.isdir(self.path(f"/sys/fs/btrfs/{expected}")):
            return expected
        return device_uuid(mount["source"])

    def probe_md(self, check: dict[str, Any], expected: str) -> Reading:
        text = read(self.path("/proc/mdstat"))
        if text is None:
            return None, NOT_APPLICABLE, "not applicable: no md driver"
        device = check["device"]
        link = self.path(device)
        if not os.path.exists(link):
            return "absent", DRIFTED, f"no {device}: the array is not assembled"
        name = os.path.basename(os.path.realpath(link))
        array = parse_mdstat(text).get(name)
        if array is None:
            return "absent", DRIFTED, f"{device} ({name}) is not in /proc/mdstat"
        members = [self._member_name(str(m)) for m in check.get("members", [])]
        live = describe_md(name, array, [m for m in members if m])
        if not array["active"]:
            return live, DRIFTED, f"{device} is {array['state']}"
        if array["degraded"] and not recovering(array):
            return live, DRIFTED, f"{device} is degraded: " + live.split(" degraded: ", 1)[-1]
        return live, OK, ""

    def _member_name(self, member: str) -> str:
        """A declared member as /proc/mdstat names it: a /dev/... path (a stable id) by the kernel name
        it points to, the path itself when it is not on the host (a lost drive, named so); a
        serial:/wwn: id is not resolved here ("" : a missing one is counted, not named)."""
        if member.startswith("/dev/"):
            path = self.path(member)
            return os.path.basename(os.path.realpath(path)) if os.path.exists(path) else member
        return "" if member.startswith(("serial:", "wwn:")) else member

    # the ML stack's doctor
    # systemd units: "active enabled" (or whatever states the role expects)
    def probe_unit(self, check: dict[str, Any], expected: str) -> Reading:
        if not systemd_is_pid1(self.root):
            return None, NOT_APPLICABLE, "not applicable: systemd is not PID 1"
        unit = check["unit"]
        _, active, _ = run(["systemctl", "is-active", unit])
        _, enabled, _ = run(["systemctl", "is-enabled", unit])
        live = f"{active.strip() or 'unknown'} {enabled.strip() or 'unknown'}"
        return compare(live, expected, f"{unit} is {live}")

    # a file the role writes: its content by SHA-256
    def probe_file(self, check: dict[str, Any], expected: str) -> Reading:
        path = check["path"]
        try:
            with open(self.path(path), "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        except FileNotFoundError:
            return None, DRIFTED, f"{path} is gone"
        except OSError as exc:
            return None, DRIFTED, f"cannot read {path}: {exc.strerror}"
        return compare(f"sha256:{digest}", expected, f"{path} was changed since the role wrote it")

    def probe_doctor(self, check: dict[str, Any], expected: str) -> Reading:
        command = check.get("command", "/opt/mlstack/bin/mlstack-doctor")
        if not os.path.isfile(self.path(command)):
            return None, DRIFTED, f"{command} is gone"
        user = check.get("user")
        argv = [command, "--json"]
        if user:
            argv = ["runuser", "-l", user, "-c", shlex.join(argv)]
        key = " ".join(argv)
        if key not in self._doctor:
            self._doctor[key] = run(argv, timeout=DOCTOR_TIMEOUT)
        rc, out, err = self._doctor[key]
        try:
            result = json.loads(out)
        except ValueError:
            return None, DRIFTED, f"{command} --json exited {rc}: {(err or out).strip()[-300:]}"
        return doctor_reading(result)


def doctor_reading(result: dict[str, Any]) -> Reading:
    """pass/fail from the doctor's JSON; the BLAS kernel and OpenMP runtime as the live value."""
    checks = result.get("checks", [])
    shown = "; ".join(f"{c['name']}: {c.get('detail', '')}" for c in checks if c.get("name") in ("blas-kernel", "openmp"))
    failed = [f"{c['name']}: {c.get('detail', '')}" for c in checks if c.get("status") == "fail"]
    if result.get("ok") and not failed:
        return "pass" + (f" ({shown})" if shown else ""), OK, ""
    return "fail", DRIFTED, "; ".join(failed) or "the doctor failed"


def compare(live: str | None, expected: str, detail: str) -> Reading:
    """ok when the live value is the expected one, else drifted with what was found."""
    if live is not None and words(str(live)) == words(expected):
        return live, OK, ""
    return live, DRIFTED, detail


# ---------------------------------------------------------------- expected files, the run, the output


def load_expected(directory: str) -> list[dict[str, Any]]:
    """Every declared check, with its role, from DIRECTORY/*.json in name order."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except FileNotFoundError as exc:
        raise BadInput(f"never provisioned: no expected state in {directory}", "provision it first") from exc
    except OSError as exc:
        raise BadInput(f"cannot read the expected state in {directory}: {exc.strerror}") from exc
    checks = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            raise BadInput(f"cannot read {path}: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("checks"), list):
            raise BadInput(f"{path} is not a schema {SCHEMA} expected-state file (role, checks)")
        role = str(doc.get("role") or name[: -len(".json")])
        for check in doc["checks"]:
            if not isinstance(check, dict) or not check.get("name") or not hasattr(Probes, f"probe_{check.get('probe')}"):
                raise BadInput(f"{path}: a check without a name or with an unknown probe: {json.dumps(check)[:200]}")
            checks.append({**check, "role": role})
    return checks


def measure_all(checks: list[dict[str, Any]], probes: Probes) -> list[dict[str, Any]]:
    """Every check's setting. A drifted one whose value a file sets gets "source" (file, line,
    managed_by_provisioner) and, when `provisioner up` cannot repair it, "repair" (what does)."""
    settings = []
    probes.checks = checks
    for check in checks:
        try:
            live, state, reason = probes.measure(check)
        except KeyError as exc:
            raise BadInput(f"role {check['role']}, check {check['name']!r}: probe {check['probe']} needs {exc}") from exc
        setting = {
            "role": check["role"],
            "name": check["name"],
            "probe": check["probe"],
            "expected": str(check.get("expected", "")),
            "live": live,
            "state": state,
            "reason": reason,
        }
        source = probes.source(check, live) if state == DRIFTED else None
        if source is not None:
            setting["source"] = source
            if not source["managed_by_provisioner"]:
                setting["repair"] = describe_source(source, str(check.get("var", "")))
        settings.append(setting)
    return settings


def exit_code(settings: list[dict[str, Any]]) -> int:
    return 1 if any(s["state"] == DRIFTED for s in settings) else 0


def report(settings: list[dict[str, Any]], seconds: float, host: str | None = None) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "host": host or socket.gethostname(),
        "seconds": round(seconds, 2),
        "settings": settings,
        "drifted": sum(s["state"] == DRIFTED for s in settings),
    }


def render_table(result: dict[str, Any]) -> str:
    rows = [("role", "setting", "expected", "live", "state")]
    order = {DRIFTED: 0, NOT_APPLICABLE: 2, OK: 1}
    for s in sorted(result["settings"], key=lambda s: order[s["state"]]):
        state = s["state"] + (f": {s['reason']}" if s["reason"] and s["state"] == DRIFTED else "")
        if s.get("repair") and s["state"] == DRIFTED:
            state += f"; {s['repair']}"
        if s["state"] == NOT_APPLICABLE:
            state = s["reason"] if s["reason"].startswith(NOT_APPLICABLE) else f"{NOT_APPLICABLE}: {s['reason']}"
        rows.append((s["role"], s["name"], s["expected"], "" if s["live"] is None else str(s["live"]), state))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows]
    lines.append("")
    lines.append(f"{result['host']}: {result['drifted']} drifted of {len(result['settings'])} settings ({result['seconds']} s)")
    return "\n".join(lines)


# ---------------------------------------------------------------- the textfile for node_exporter


# A metric: (name, help, label names, [(labels, value)]); every one is a gauge.
Metric = tuple[str, str, tuple[str, ...], list[tuple[dict[str, str], float]]]


def metric_samples(result: dict[str, Any], plan: dict[str, Any], now: float) -> list[Metric]:
    """Every metric the textfile holds: drift per setting (not applicable ones left out), the
    count, when it ran, and the plan's values (numbers as values, strings as info labels)."""
    drifted = [
        ({"role": s["role"], "setting": s["name"]}, 1.0 if s["state"] == DRIFTED else 0.0)
        for s in result["settings"]
        if s["state"] != NOT_APPLICABLE
    ]
    values = (plan.get("values") or {}) if isinstance(plan, dict) else {}
    numbers, strings = [], []
    for key in sorted(values):
        value = values[key]
        if isinstance(value, bool):
            numbers.append(({"key": key}, 1.0 if value else 0.0))
        elif isinstance(value, (int, float)) and math.isfinite(value):
            numbers.append(({"key": key}, float(value)))
        elif isinstance(value, str):
            strings.append(({"key": key, "value": value}, 1.0))
    return [
        (
            "provisioner_setting_drifted",
            "1 when the live value of a setting a role manages is not the expected one",
            ("role", "setting"),
            drifted,
        ),
        (
            "provisioner_settings_drifted",
            "Settings whose live value is not the expected one",
            (),
            [({}, float(result["drifted"]))],
        ),
        ("provisioner_status_last_run_timestamp_seconds", "When the drift check last ran", (), [({}, now)]),
        ("provisioner_plan_value", "A numeric value of the plan the host was provisioned with", ("key",), numbers),
        ("provisioner_plan_info", "A string value of the plan the host was provisioned with", ("key", "value"), strings),
    ]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_metrics(metrics: list[Metric]) -> str:
    """The Prometheus text exposition format (version 0.0.4), without prometheus_client."""
    lines = []
    for name, text, _labelnames, points in metrics:
        lines.append(f"# HELP {name} {text}")
        lines.append(f"# TYPE {name} gauge")
        for labels, value in points:
            label = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{label}}} {value!r}" if label else f"{name} {value!r}")
    return "\n".join(lines) + "\n"


def write_textfile(directory: str, metrics: list[Metric], use_client: bool = True) -> str:
    """DIRECTORY/provisioner_status.prom, written to a temporary file there and renamed
    (prometheus_client.write_to_textfile when it is importable)."""
    path = os.path.join(directory, TEXTFILE_NAME)
    client = _prometheus_client() if use_client else None
    if client is not None:
        registry = client.CollectorRegistry()
        for name, text, labelnames, points in metrics:
            gauge = client.Gauge(name, text, labelnames, registry=registry)
            for labels, value in points:
                (gauge.labels(**labels) if labels else gauge).set(value)
        client.write_to_textfile(path, registry)
        os.chmod(path, 0o644)
        return path
    fd, tmp = tempfile.mkstemp(prefix=f".{TEXTFILE_NAME}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(render_metrics(metrics))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _prometheus_client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        return None
    return prometheus_client


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None, probes_factory: Callable[[], Probes] = Probes) -> int:
    parser = argparse.ArgumentParser(prog="provisioner-status", description=__doc__.splitlines()[0])
    parser.add_argument("--expected-dir", default=EXPECTED_DIR, help=f"the roles' declarations (default {EXPECTED_DIR})")
    parser.add_argument("--plan", default=PLAN_FILE, help=f"the plan the host recorded (default {PLAN_FILE})")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--textfile", metavar="DIR", help=f"also write DIR/{TEXTFILE_NAME} for node_exporter")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        checks = load_expected(args.expected_dir)
        settings = measure_all(checks, probes_factory())
    except BadInput as exc:
        if args.json:
            # On stdout, where the caller reads the result: over SSH with a terminal (Ansible's
            # script module) stderr is merged into stdout and the caller's stderr holds only
            # ssh's own "Shared connection to HOST closed".
            print(json.dumps({"schema": SCHEMA, "host": socket.gethostname(), "error": str(exc), "fix": exc.fix}))
        else:
            print(f"provisioner-status: {exc}; {exc.fix}: provisioner up", file=sys.stderr)
        return BAD_INPUT
    result = report(settings, time.monotonic() - started)
    if args.textfile:
        if not os.path.isdir(args.textfile):
            print(f"provisioner-status: --textfile {args.textfile} is not a directory", file=sys.stderr)
            return BAD_INPUT
        try:
            with open(args.plan, encoding="utf-8") as f:
                plan = json.load(f)
        except (OSError, ValueError):
            plan = {}
        write_textfile(args.textfile, metric_samples(result, plan, time.time()))
    print(json.dumps(result, indent=1) if args.json else render_table(result))
    return exit_code(settings)


if __name__ == "__main__":
    sys.exit(main())
