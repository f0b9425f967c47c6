"""What the kernel and the boot apply: sysctl as systemd-sysctl applies it, THP, tmpfiles.d, cpufreq,
hugepages, md arrays and mounts."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from provisioner_status.common import CPUFREQ, SYSCTL_CONF, SYSCTL_DIRS, read, run, words

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
