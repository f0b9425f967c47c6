"""Where a drifted variable is set: the file and line a login shell or systemd's manager got it from,
and whether a run of provisioner repairs it."""

from __future__ import annotations

import itertools
import os
import re
import shlex
from typing import Any

from provisioner_status.common import CLEAN_PATH, read
from provisioner_status.kernel import _masked

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
