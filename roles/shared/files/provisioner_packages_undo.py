"""Undo of the packages one role's installs added (role shared, entry point packages_undo).

Runs on the host under Debian's own Python (stdlib only), as root:

    python3 - RECORD ROLE [--keep] [--check]   (this file on stdin)

RECORD is originals/packages.json: the packages as the first install found them (`before`) and,
by role, what each install added to dpkg's database, what it removed, and the users and groups
the packages' scripts created. For ROLE it purges exactly the packages its installs added and
that are still installed (a package that was there before the first install is never touched;
one that had left only its configuration files behind is removed, not purged, so they stay),
then deletes the users and groups those packages created. A package that another installed
package still needs (something installed by hand since, or another role's package when undo
runs for some roles only) stays, with the package that needs it; it stays in the record for a
later undo. --keep purges nothing and forgets the role's entries (what the docs keep on
purpose). --check changes nothing and says what a real run would do.

Prints one JSON object: changed, purged, removed (config files kept), kept ({package: reason}),
users, groups (deleted), notes. The record loses the role's entries that are done with; without
any entry left the file goes, so a second undo finds nothing to do.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

KINDS = ("added", "removed", "users_added", "groups_added")
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
# The relations of an installed package that make apt remove it with what it needs.
HARD = ("Depends", "PreDepends")

Runner = Callable[[Sequence[str]], "tuple[int, str]"]


def run(argv: Sequence[str]) -> tuple[int, str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, env={**os.environ, **APT_ENV}, check=False)
    return done.returncode, done.stdout + done.stderr


def dpkg_states(lines: Iterable[str]) -> dict[str, str]:
    """dpkg-query's '${db:Status-Status} ${Package}' lines as {package: status}."""
    states = {}
    for line in lines:
        status, _, name = line.strip().partition(" ")
        if name:
            states[name] = status
    return states


def simulated_removals(output: str) -> set[str]:
    """The packages `apt-get -s purge/remove` would take off the system ('Purg X', 'Remv X')."""
    return set(re.findall(r"(?m)^(?:Purg|Remv) (\S+)", output))


def hard_dependencies(output: str) -> set[str]:
    """The packages named by `apt-cache depends --recurse` output: the top-level names and their
    Depends/PreDepends (alternatives listed with '|' count as well)."""
    names = set()
    for line in output.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            names.add(line.strip().strip("<>"))
            continue
        m = re.match(r"\s*\|?(\w+): <?([^\s>]+)>?", line)
        if m and m.group(1) in HARD:
            names.add(m.group(2))
    return {n.split(":")[0] for n in names}


def candidates(record: dict[str, Any], role: str, states: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The role's added packages that are still on the system and were not there before the
    first install; {package: reason} for those left alone."""
    before = set(record.get("before", {}).get("installed", []))
    chosen, skipped = [], {}
    for name in record.get("added", {}).get(role, []):
        if name in before:
            skipped[name] = "installed before the first run"
        elif states.get(name, "not-installed") in ("not-installed", "config-files"):
            continue  # gone already (removed by hand, or by an earlier undo)
        else:
            chosen.append(name)
    return sorted(chosen), skipped


def split_config_files(record: dict[str, Any], names: Iterable[str]) -> tuple[list[str], list[str]]:
    """(to purge, to remove): a package whose configuration files were there before the first
    install (dpkg's config-files state) gets them back as they were: removed, not purged."""
    kept_conf = set(record.get("before", {}).get("config_files", []))
    names = sorted(names)
    return [n for n in names if n not in kept_conf], [n for n in names if n in kept_conf]


def settle(chosen: list[str], runner: Runner, rounds: int = 5) -> tuple[list[str], dict[str, str]]:
    """CHOSEN less the packages whose purge would take another package with it (apt removes an
    installed package together with what it depends on). Asks apt (-s) and apt-cache; {package: reason}."""
    chosen = sorted(chosen)
    held: dict[str, str] = {}
    for _ in range(rounds):
        if not chosen:
            break
        rc, out = runner(["apt-get", "-s", "-o", "Debug::NoLocking=1", "purge", *chosen])
        if rc != 0:
            reason = "apt cannot plan its purge: " + (out.strip().splitlines() or ["no output"])[-1]
            held.update({n: reason for n in chosen})
            return [], held
        others = sorted(simulated_removals(out) - set(chosen))
        if not others:
            return chosen, held
        rc, deps = runner(
            [
                "apt-cache",
                "depends",
                "--installed",
                "--recurse",
                "--no-recommends",
                "--no-suggests",
                "--no-conflicts",
                "--no-breaks",
                "--no-replaces",
                "--no-enhances",
                *others,
            ]
        )
        needed = hard_dependencies(deps) & set(chosen) if rc == 0 else set(chosen)
        if not needed:  # apt would take them for another reason: keep everything rather than guess
            needed = set(chosen)
        for name in needed:
            held[name] = "needed by " + ", ".join(others) + " (installed since, or by a role not undone)"
        chosen = [n for n in chosen if n not in needed]
    else:
        held.update({n: "apt's plan did not settle" for n in chosen})
        chosen = []
    return chosen, held


def accounts(runner: Runner, database: str) -> dict[str, list[str]]:
    """getent DATABASE as {name: fields}."""
    rc, out = runner(["getent", database])
    return {line.split(":")[0]: line.split(":") for line in out.splitlines() if ":" in line} if rc in (0, 2) else {}


def purged_program(pid: str) -> bool:
    """Whether process PID runs a program whose file is gone (its package was just purged)."""
    try:
        return os.readlink(f"/proc/{pid}/exe").endswith(" (deleted)")
    except OSError:
        return False


def stop(pids: Iterable[str], wait: float = 5.0) -> None:
    """SIGTERM to PIDS, SIGKILL to those still there after WAIT seconds."""
    import signal
    import time

    numbers = [int(p) for p in pids]
    for pid in numbers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in numbers):
        time.sleep(0.1)
    for pid in numbers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def busy_users(
    runner: Runner,
    names: Iterable[str],
    *,
    check: bool = False,
    leftover: Callable[[str], bool] = purged_program,
    stopper: Callable[[Iterable[str]], None] = stop,
) -> dict[str, str]:
    """{user: reason} for the users among NAMES that run processes now. A daemon of a purged
    package (its program gone from disk: purge does not stop every daemon, polkitd under D-Bus
    for one) is stopped rather than counted; anything else the user runs keeps the user."""
    busy = {}
    for name in names:
        rc, out = runner(["ps", "-o", "pid=", "-u", name])
        pids = out.split() if rc == 0 else []
        if pids and all(leftover(pid) for pid in pids):
            if not check:
                stopper(pids)
            continue
        if pids:
            busy[name] = "runs processes " + " ".join(pids[:5])
    return busy


def forget(record: dict[str, Any], role: str, keep_added: Iterable[str] = ()) -> dict[str, Any]:
    """RECORD without ROLE's entries, except the added packages in KEEP_ADDED (still to undo)."""
    out = {k: v for k, v in record.items() if k not in KINDS}
    keep = sorted(set(keep_added))
    for kind in KINDS:
        entries = {r: list(v) for r, v in record.get(kind, {}).items() if r != role}
        if kind == "added" and keep:
            entries[role] = keep
        out[kind] = entries
    return out


def empty(record: dict[str, Any]) -> bool:
    return not any(v for kind in KINDS for v in record.get(kind, {}).values())


def undo(
    record: dict[str, Any], role: str, *, keep: bool, check: bool, runner: Runner = run
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the result to print, the record to write back)."""
    result: dict[str, Any] = {"changed": False, "purged": [], "removed": [], "kept": {}, "users": [], "groups": [], "notes": []}
    if not any(record.get(kind, {}).get(role) for kind in KINDS):
        return result, record
    rc, out = runner(["dpkg-query", "--show", "--showformat=${db:Status-Status} ${Package}\\n"])
    if rc != 0:
        raise RuntimeError("cannot read dpkg's database: " + out.strip())
    chosen, skipped = candidates(record, role, dpkg_states(out.splitlines()))
    result["kept"].update(skipped)
    held: dict[str, str]
    if keep:
        result["kept"].update({n: "kept on purpose" for n in chosen})
        chosen, held = [], {}
    else:
        chosen, held = settle(chosen, runner)
        result["kept"].update(held)
    purge, remove = split_config_files(record, chosen)
    for verb, names in (("purge", purge), ("remove", remove)):
        if not names:
            continue
        if not check:
            rc, out = runner(["apt-get", "-y", "-q", verb, *names])
            if rc != 0:
                raise RuntimeError(f"apt-get {verb} {' '.join(names)} failed: " + (out.strip().splitlines() or ["no output"])[-1])
        result["purged" if verb == "purge" else "removed"] = names
        result["changed"] = True
    # The users and groups the packages' scripts created (a system user for a daemon).
    if not keep:
        present = accounts(runner, "passwd")
        users = [u for u in record.get("users_added", {}).get(role, []) if u in present]
        busy = busy_users(runner, users, check=check)
        result["kept"].update({f"user {u}": why for u, why in busy.items()})
        for user in (u for u in users if u not in busy):
            if not check:
                rc, out = runner(["userdel", user])
                if rc != 0:
                    raise RuntimeError(f"userdel {user} failed: " + out.strip())
            result["users"].append(user)
            result["changed"] = True
        remaining = {u: f for u, f in accounts(runner, "passwd").items() if u not in result["users"]}
        primary = {fields[3] for fields in remaining.values() if len(fields) > 3}
        existing = accounts(runner, "group")
        for group in record.get("groups_added", {}).get(role, []):
            if group not in existing or len(existing[group]) < 3:
                continue
            if existing[group][2] in primary:
                result["kept"][f"group {group}"] = "the primary group of a user that stays"
                continue
            if not check:
                rc, out = runner(["groupdel", group])
                if rc != 0 and group in accounts(runner, "group"):  # userdel may have taken it already
                    raise RuntimeError(f"groupdel {group} failed: " + out.strip())
            result["groups"].append(group)
            result["changed"] = True
    gone = [n for n in record.get("removed", {}).get(role, []) if n in record.get("before", {}).get("installed", [])]
    if gone:
        result["notes"].append("its install removed " + ", ".join(gone) + " (not installed again: apt install them if needed)")
    if record.get("provisioned_before"):
        result["notes"].append("packages installed by runs before this host kept a record of them stay (not known)")
    return result, forget(record, role, held)


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    flags = {a for a in argv if a.startswith("--")}
    if len(args) != 2 or flags - {"--keep", "--check"}:
        print("usage: provisioner_packages_undo.py RECORD ROLE [--keep] [--check]", file=sys.stderr)
        return 2
    path, role = args
    try:
        with open(path) as f:
            record = json.load(f)
    except FileNotFoundError:
        print(json.dumps({"changed": False, "purged": [], "removed": [], "kept": {}, "users": [], "groups": [], "notes": []}))
        return 0
    try:
        result, after = undo(record, role, keep="--keep" in flags, check="--check" in flags)
    except RuntimeError as e:
        print(str(e), file=sys.stderr)
        return 1
    if "--check" not in flags and after != record:
        if empty(after):
            os.unlink(path)
        else:
            tmp = path + ".tmp"
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                json.dump(after, f, indent=4, sort_keys=True)
                f.write("\n")
            os.replace(tmp, path)
        result["changed"] = True
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
