#!/usr/bin/python
# Copyright: provisioner contributors
# Apache License 2.0 (see pyproject.toml)
"""Generations of the ML environment: each lock builds its own environment in a store beside the
live one, and the stable path (a symlink) is switched to it in one rename once it is proven.

The work is in module-level functions so the unit tests drive them on real directories."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: provisioner_mlstack_generation
short_description: Build, switch, prune and list generations of the ML environment
description:
  - The ML environment's stable path O(link) (for example C(/opt/mlstack)) is a symlink to one generation in
    O(store) (for example C(/opt/mlstack-envs/3f2a9c1d0b7e)). Every path users and services use goes through
    the link, so a switch is one C(rename(2)) of a new symlink over the old one, never a moment without it.
  - O(state=info) lists the generations, the live one, their sizes, the processes that still use each, and the
    free space of the store.
  - O(state=prepared) makes the directory of generation O(name) for a build, a hard-link copy of the live
    generation (O(clone)), with the scripts' interpreter lines and the activate scripts pointed at the new
    directory, so pip only installs what changed. It refuses, before anything is written, a build that would
    not fit beside the kept generations (the largest build's own size plus a tenth and 64 MiB).
  - O(state=live) records O(name) as built and switches the link to it. A link that is still a real directory
    (an environment from a release before generations) swaps places with the link and goes aside in the store.
  - O(state=pruned) keeps the live generation and the O(keep) - 1 most recently live others and removes the
    rest, the unfinished builds and the moved-aside directories, except what a running process still uses.
  - O(state=absent) removes generation O(name) (never the live one), or without O(name) the link and the
    whole store (undo).
version_added: "0.1.0"
author:
  - provisioner contributors
options:
  link:
    description: The stable path of the environment (a symlink to the live generation).
    type: path
    required: true
  store:
    description: The directory that holds the generations.
    type: path
    required: true
  state:
    description: What to do (see the description).
    type: str
    choices: [info, prepared, live, pruned, absent]
    default: info
  name:
    description: The generation (a short hash of what it holds) to prepare, switch to or remove.
    type: str
  clone:
    description: With O(state=prepared), start from a hard-link copy of the live generation.
    type: bool
    default: true
  keep:
    description: With O(state=pruned), how many generations stay, the live one counted (at least 1).
    type: int
    default: 2
  services:
    description:
      - With O(state=live), the systemd services (shell-style patterns) that may be restarted for the switch;
        RV(restart) lists those among them whose processes run from the previous generation. Processes outside
        these services (a user's job) are never named; they keep their generation until they end.
    type: list
    elements: str
    default: []
notes:
  - Supports check mode (nothing is written; the result says what a real run would do).
"""

EXAMPLES = r"""
- name: Switch the environment to the proven generation
  provisioner_mlstack_generation:
    link: /opt/mlstack
    store: /opt/mlstack-envs
    name: 3f2a9c1d0b7e
    state: live
"""

RETURN = r"""
live:
  description: The live generation after the task (null when the link is missing or a real directory).
  type: str
  returned: always
previous:
  description: The generation that was live before the task.
  type: str
  returned: always
generations:
  description: Every finished generation, most recently live first, with path, bytes, own_bytes, built, live_since, in_use (pids).
  type: list
  returned: always
removed:
  description: What O(state=pruned) or O(state=absent) removed (or would remove in check mode).
  type: list
  returned: always
restart:
  description: With O(state=live), the services matching O(services) that run from another generation.
  type: list
  returned: always
still_on_previous:
  description: With O(state=live), the other services that run from another generation (never restarted here).
  type: list
  returned: with O(state=live)
legacy:
  description: O(link) is a real directory (an environment made before generations, or the user's own).
  type: bool
  returned: always
foreign:
  description: Something is at O(link) that is not a link to a generation of O(store).
  type: bool
  returned: always
"""

import contextlib
import fnmatch
import json
import os
import re
import shutil
import subprocess
import time

HISTORY = "generations.json"
LEGACY_PREFIX = ".legacy-"
NAME_RE = re.compile(r"^[0-9a-f]{6,64}$")
MARGIN_BYTES = 64 << 20


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def read_history(store: str) -> dict:
    """{"builds": {name: {built, bytes, own_bytes}}, "live": [{name, since}, ...] oldest first}."""
    try:
        with open(os.path.join(store, HISTORY), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    return {"builds": dict(data.get("builds") or {}), "live": list(data.get("live") or [])}


def write_history(store: str, history: dict) -> None:
    path = os.path.join(store, HISTORY)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(history, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def live_name(link: str, store: str) -> str | None:
    """The generation the link points at, or None (missing link, a real directory, elsewhere)."""
    if not os.path.islink(link):
        return None
    target = os.path.realpath(link)
    if os.path.dirname(target) != os.path.realpath(store):
        return None
    return os.path.basename(target)


def tree_bytes(path: str) -> tuple[int, int]:
    """Bytes on disk under PATH: all of them (each inode once), and those of inodes no other
    directory shares (a link count of 1: what removing PATH would free)."""
    seen: set[int] = set()
    total = own = 0
    for root, dirs, files in os.walk(path):
        for entry in dirs + files:
            try:
                st = os.lstat(os.path.join(root, entry))
            except OSError:
                continue
            if st.st_ino in seen:
                continue
            seen.add(st.st_ino)
            size = st.st_blocks * 512
            total += size
            if st.st_nlink == 1 or os.path.isdir(os.path.join(root, entry)):
                own += size
    return total, own


def users_of(paths: list[str], proc: str = "/proc") -> dict[str, list[int]]:
    """For each directory in PATHS, the pids whose executable, working directory, open files or
    mapped files lie under it (a running job keeps its generation's files until it ends)."""
    found: dict[str, list[int]] = {p: [] for p in paths}
    prefixes = [(p, os.path.realpath(p).rstrip("/") + "/") for p in paths]
    try:
        pids = [int(d) for d in os.listdir(proc) if d.isdigit()]
    except OSError:
        return found
    for pid in pids:
        seen: set[str] = set()
        for what in ("exe", "cwd"):
            with contextlib.suppress(OSError):
                seen.add(os.readlink(os.path.join(proc, str(pid), what)))
        # The start-up hook (provisioner_generation) keeps its generation's directory open for
        # the process's life: a job that has imported only pure-Python modules shows here.
        fds = os.path.join(proc, str(pid), "fd")
        with contextlib.suppress(OSError):
            for fd in os.listdir(fds):
                with contextlib.suppress(OSError):
                    seen.add(os.readlink(os.path.join(fds, fd)))
        try:
            with open(os.path.join(proc, str(pid), "maps"), encoding="utf-8", errors="replace") as f:
                for line in f:
                    fields = line.split(None, 5)
                    if len(fields) == 6:
                        seen.add(fields[5].strip())
        except OSError:
            pass
        for path, prefix in prefixes:
            if any(s.startswith(prefix) or s == prefix[:-1] for s in seen):
                found[path].append(pid)
    return found


def unit_of(pid: int, proc: str = "/proc") -> str | None:
    """The systemd service PID runs in (its cgroup's last part), or None (a session, a scope)."""
    try:
        with open(os.path.join(proc, str(pid), "cgroup"), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        last = line.rpartition("/")[2]
        if last.endswith(".service") and "/user.slice/" not in line:
            return last
    return None


def services_on(paths: list[str], proc: str = "/proc") -> list[str]:
    """The services with a process that runs from one of PATHS, in name order."""
    found = users_of(paths, proc)
    return sorted({u for pids in found.values() for pid in pids if (u := unit_of(pid, proc))})


def matching(units: list[str], patterns: list[str]) -> list[str]:
    return [u for u in units if any(fnmatch.fnmatchcase(u, p) for p in patterns)]


def others(store: str, live: str) -> list[str]:
    """Every directory of the store but the live generation (earlier ones, moved-aside ones)."""
    if not os.path.isdir(store):
        return []
    real = os.path.realpath(live)
    return [p for e in sorted(os.listdir(store)) if os.path.isdir(p := os.path.join(store, e)) and os.path.realpath(p) != real]


def recorded(link: str, store: str) -> dict:
    """The history, with the live generation in it even when the file lost it (a run stopped
    between the rename and the write, the file removed): a live generation is never taken for an
    unfinished build."""
    history = read_history(store)
    live = live_name(link, store)
    if live and live not in history["builds"]:
        history["builds"][live] = {"built": None, "bytes": None, "own_bytes": None}
        if not any(e.get("name") == live for e in history["live"]):
            history["live"].append({"name": live, "since": None})
    return history


def ordered(history: dict, store: str) -> list[str]:
    """Finished generations that still exist, most recently live first (the history's order; never
    live: by build time, after them)."""
    turn = {entry.get("name"): i for i, entry in enumerate(history["live"])}
    names = [n for n in history["builds"] if os.path.isdir(os.path.join(store, n))]
    return sorted(names, key=lambda n: (turn.get(n, -1), history["builds"][n].get("built") or ""), reverse=True)


def describe(link: str, store: str, with_users: bool = True) -> dict:
    history = recorded(link, store)
    names = ordered(history, store)
    users = users_of([os.path.join(store, n) for n in names]) if with_users else {}
    last_live = {e["name"]: e["since"] for e in history["live"]}
    live = live_name(link, store)
    generations = []
    for n in names:
        build = history["builds"][n]
        path = os.path.join(store, n)
        generations.append(
            {
                "name": n,
                "path": path,
                "live": n == live,
                "built": build.get("built"),
                "live_since": last_live.get(n),
                "bytes": build.get("bytes"),
                "own_bytes": build.get("own_bytes"),
                "in_use": users.get(path, []),
            }
        )
    try:
        st = os.statvfs(store if os.path.isdir(store) else os.path.dirname(store.rstrip("/")) or "/")
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    return {
        "live": live,
        "legacy": os.path.isdir(link) and not os.path.islink(link),
        "foreign": os.path.lexists(link) and live is None,
        "generations": generations,
        "free_bytes": free,
    }


def rewrite_prefix(directory: str, old: str, new: str) -> list[str]:
    """Point the interpreter lines of DIRECTORY/bin's scripts and its activate scripts from OLD to NEW.
    Each file is rewritten to a new inode, so the generation it was linked from keeps its own."""
    changed: list[str] = []
    bindir = os.path.join(directory, "bin")
    if not os.path.isdir(bindir):
        return changed
    # OLD as a whole path (followed by a slash, a quote, a space or the end), never a prefix of a longer name.
    pattern = re.compile(re.escape(old.encode()) + rb"(?=[/\"'\s]|$)", re.M)
    new_b = new.encode().replace(b"\\", b"\\\\")
    for entry in sorted(os.listdir(bindir)):
        path = os.path.join(bindir, entry)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if entry.startswith("activate"):
            updated = pattern.sub(new_b, data)
        elif data.startswith(b"#!"):
            first, sep, rest = data.partition(b"\n")
            updated = pattern.sub(new_b, first) + sep + rest
            # pip's launcher of a long interpreter path: '#!/bin/sh' then `'''exec' OLD/bin/python "$0" "$@"`.
            if first == b"#!/bin/sh":
                second, sep2, rest2 = rest.partition(b"\n")
                updated = first + sep + pattern.sub(new_b, second) + sep2 + rest2
        else:
            continue
        if updated == data:
            continue
        st = os.lstat(path)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(updated)
        os.chmod(tmp, st.st_mode & 0o7777)
        os.chown(tmp, st.st_uid, st.st_gid)
        os.replace(tmp, path)
        changed.append(entry)
    cfg = os.path.join(directory, "pyvenv.cfg")
    if os.path.isfile(cfg):
        with open(cfg, encoding="utf-8") as f:
            text = f.read()
        updated_text = pattern.sub(new_b, text.encode()).decode()
        if updated_text != text:
            st = os.lstat(cfg)
            tmp = f"{cfg}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(updated_text)
            os.chmod(tmp, st.st_mode & 0o7777)
            os.chown(tmp, st.st_uid, st.st_gid)
            os.replace(tmp, cfg)
            changed.append("pyvenv.cfg")
    return changed


def space_needed(history: dict) -> int | None:
    """What a new build may write: the largest build's own bytes (a build from nothing, or the
    largest change a copy took) plus a tenth and 64 MiB; None before any build (pip says so
    itself if the disk fills)."""
    sizes = [b.get("own_bytes") for b in history["builds"].values() if isinstance(b.get("own_bytes"), int)]
    return int(max(sizes) * 1.1) + MARGIN_BYTES if sizes else None


def gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def prepare(link: str, store: str, name: str, clone: bool, check: bool) -> dict:
    """The directory of generation NAME, ready for pip (a hard-link copy of the live one with CLONE)."""
    path = os.path.join(store, name)
    history = recorded(link, store)
    if name in history["builds"] and os.path.isdir(path):
        return {"changed": False, "path": path, "built": True, "msg": f"generation {name} is built already"}
    if os.path.lexists(path) and not check:  # an unfinished build of an earlier run: its space counts as free
        shutil.rmtree(path)
    needed = space_needed(history)
    free = describe(link, store, with_users=False)["free_bytes"]
    if needed is not None and free is not None and free < needed:
        return {
            "failed": True,
            "msg": (
                f"mlstack: a new generation needs about {gib(needed)} beside the kept ones (the largest build's own size"
                f" plus a margin) and {store} has {gib(free)} free: free space on that filesystem (the generations"
                f" kept are listed in {os.path.join(store, HISTORY)})"
            ),
        }
    live = os.path.realpath(link) if os.path.isdir(link) else None
    source = live if clone and live else None
    result = {"changed": True, "path": path, "built": False, "clone_of": source}
    if check:
        return result
    os.makedirs(store, mode=0o755, exist_ok=True)
    if source:
        subprocess.run(["cp", "-a", "-l", "--", source, path], check=True)
        result["rewritten"] = rewrite_prefix(path, source, path)
    return result


RENAME_EXCHANGE = 2


def exchange(a: str, b: str) -> bool:
    """Swap the paths A and B in one step (renameat2 RENAME_EXCHANGE); False where the kernel or
    the filesystem cannot."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    return renameat2(at_fdcwd, a.encode(), at_fdcwd, b.encode(), RENAME_EXCHANGE) == 0


def switch(link: str, store: str, name: str, check: bool, services: list[str] | None = None) -> dict:
    """Record NAME as built and point LINK at it in one step. RESTART: the services matching
    SERVICES that run from another generation (the one it replaced, or one a restart that failed
    left them on); STILL_ON_PREVIOUS: the other services that do (never restarted here)."""
    path = os.path.join(store, name)
    if not os.path.isdir(path):
        return {"failed": True, "msg": f"mlstack: generation {name} does not exist in {store}"}
    previous = live_name(link, store)
    history = recorded(link, store)
    switching = not (previous == name and name in history["builds"])
    stale = others(store, path)
    if os.path.isdir(link) and not os.path.islink(link):
        stale.append(link)
    units = services_on(stale) if stale else []
    restart = matching(units, list(services or []))
    result = {
        "changed": switching or bool(restart),
        "live": name,
        "previous": previous,
        "moved_aside": None,
        "restart": restart,
        "still_on_previous": [u for u in units if u not in restart],
    }
    if check or not switching:
        return result
    if name not in history["builds"] or history["builds"][name].get("bytes") is None:
        total, own = tree_bytes(path)
        history["builds"][name] = {"built": now(), "bytes": total, "own_bytes": own}
    history["live"] = [e for e in history["live"] if e.get("name") != name] + [{"name": name, "since": now()}]
    write_history(store, history)  # first: a stop after the rename still finds the live one recorded
    tmp = os.path.join(os.path.dirname(link), f".{os.path.basename(link)}.{os.getpid()}.tmp")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(path, tmp)
    if os.path.isdir(link) and not os.path.islink(link):
        # An environment of a release before generations: the link and the directory swap places
        # in one step, then the directory goes aside; where the swap is not possible, two renames.
        aside = os.path.join(store, f"{LEGACY_PREFIX}{time.strftime('%Y%m%d%H%M%S')}")
        if exchange(tmp, link):
            os.rename(tmp, aside)
        else:
            os.rename(link, aside)
            os.replace(tmp, link)
        result["moved_aside"] = aside
    else:
        os.replace(tmp, link)
    return result


def prune(link: str, store: str, keep: int, check: bool, spare: str | None = None) -> dict:
    """Keep the live generation and the KEEP - 1 most recently live others; remove the rest, the
    unfinished builds (but SPARE) and the moved-aside directories, except those a process uses.
    The link's target is never removed."""
    history = recorded(link, store)
    live = live_name(link, store)
    target = os.path.realpath(link) if os.path.lexists(link) else None
    names = ordered(history, store)
    rest = [n for n in names if n != live]
    stay = set([live] if live else []) | set(rest[: max(keep - 1, 0)])
    candidates = [n for n in names if n not in stay]
    if os.path.isdir(store):
        for entry in sorted(os.listdir(store)):
            full = os.path.join(store, entry)
            if entry in names or entry == spare or not os.path.isdir(full) or os.path.islink(full):
                continue
            if entry.startswith(LEGACY_PREFIX) or (NAME_RE.match(entry) and entry not in history["builds"]):
                candidates.append(entry)
    candidates = [n for n in candidates if os.path.realpath(os.path.join(store, n)) != target]
    users = users_of([os.path.join(store, n) for n in candidates])
    removed, in_use = [], {}
    for n in candidates:
        path = os.path.join(store, n)
        if users[path]:
            in_use[n] = users[path]
            continue
        removed.append(n)
        if not check:
            shutil.rmtree(path)
            history["builds"].pop(n, None)
    if removed and not check:
        history["live"] = [e for e in history["live"] if e.get("name") not in removed]
        write_history(store, history)
    return {"changed": bool(removed), "removed": removed, "kept_in_use": in_use, "live": live}


def remove(link: str, store: str, name: str | None, check: bool) -> dict:
    """Remove generation NAME (never the live one), or the link and the whole store."""
    if name:
        if name == live_name(link, store) or os.path.realpath(os.path.join(store, name)) == os.path.realpath(link):
            return {"failed": True, "msg": f"mlstack: generation {name} is live; switch to another before removing it"}
        path = os.path.join(store, name)
        if not os.path.lexists(path):
            return {"changed": False, "removed": []}
        if not check:
            shutil.rmtree(path)
            history = recorded(link, store)
            if name in history["builds"]:
                history["builds"].pop(name)
                write_history(store, history)
        return {"changed": True, "removed": [name]}
    removed = [p for p in (link, store) if os.path.lexists(p)]
    if not check:
        if os.path.islink(link):
            os.unlink(link)
        elif os.path.isdir(link):
            shutil.rmtree(link)
        if os.path.isdir(store):
            shutil.rmtree(store)
    return {"changed": bool(removed), "removed": removed}


def run(params: dict, check: bool) -> dict:
    link = params["link"].rstrip("/") or "/"
    store = params["store"].rstrip("/") or "/"
    state, name = params["state"], params.get("name") or ""
    if name and not NAME_RE.match(name):
        return {"failed": True, "msg": f"mlstack: {name!r} is not a generation name (6 to 64 hex digits)"}
    if state in ("prepared", "live") and not name:
        return {"failed": True, "msg": f"mlstack: state={state} needs the name of a generation"}
    if state == "pruned" and params["keep"] < 1:
        return {"failed": True, "msg": f"mlstack: keep must be 1 or more (got {params['keep']})"}
    previous = live_name(link, store)
    if state == "prepared":
        result = prepare(link, store, name, params["clone"], check)
    elif state == "live":
        result = switch(link, store, name, check, params.get("services") or [])
    elif state == "pruned":
        result = prune(link, store, params["keep"], check, spare=name or None)
    elif state == "absent":
        result = remove(link, store, name or None, check)
    else:
        result = {"changed": False}
    if result.get("failed"):
        return result
    result.setdefault("previous", previous)
    result.setdefault("removed", [])
    result.setdefault("restart", [])
    info = describe(link, store)
    result.setdefault("live", info["live"])
    result.update(generations=info["generations"], legacy=info["legacy"], foreign=info["foreign"], free_bytes=info["free_bytes"])
    return result


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "link": {"type": "path", "required": True},
            "store": {"type": "path", "required": True},
            "state": {"type": "str", "default": "info", "choices": ["info", "prepared", "live", "pruned", "absent"]},
            "name": {"type": "str"},
            "clone": {"type": "bool", "default": True},
            "keep": {"type": "int", "default": 2},
            "services": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    result = run(module.params, module.check_mode)
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
