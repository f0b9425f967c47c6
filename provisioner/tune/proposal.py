"""The control node's half of `provisioner tune`: the options checked before any host is touched,
hosts grouped into hardware classes, each host's measurements read as a proposal, and the kept
values written into the inventory as the plan's overrides with their evidence.

Write-back goes to host_vars/HOST.yml beside the inventory (Ansible reads it for that host in any
inventory format), through ruamel.yaml's round trip: the file's comments, order and other keys stay
as they were. Each tuned knob becomes plan_<knob> (the plan's override, which the roles apply) and
an entry of plan_tuned (knob -> evidence), which `provisioner plan` shows as the value's reason. A
class of identical hosts is measured on one of them; its values go once into group_vars of the
class's group (hw_FINGERPRINT), which is added to the inventory with the members, the evidence
naming the host it was measured on.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from provisioner import paths
from provisioner.errors import BadInput
from provisioner.smoke.workloads import BY_NAME
from provisioner.tune import knobs as knob_table

# Workloads with a tune objective, in the order they run; the default of --workloads.
TUNABLE: tuple[str, ...] = tuple(name for name, w in BY_NAME.items() if getattr(w, "TUNE", None) is not None)
# The fewest pairs that decide a candidate (5) take 20-45 s on 2 cores (features about 3.5 s a
# pair, sklearn and the DataLoader 8-10 s, measured on a lab server), plus the run's start: a
# budget below this decides nothing.
MIN_BUDGET_S = 60


def parse_budget(text: str) -> int:
    """'10m', '90s', '1h30m' or plain seconds -> seconds; refused below MIN_BUDGET_S."""
    raw = text.strip().lower()
    if raw.isdigit():
        seconds = int(raw)
    else:
        parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", raw)
        if not raw or not parts:
            raise BadInput(f"--budget {text!r} is not a duration: write it like 10m, 90s, 1h30m or a number of seconds")
        h, m, s = (int(g or 0) for g in parts.groups())
        seconds = h * 3600 + m * 60 + s
    if seconds < MIN_BUDGET_S:
        raise BadInput(
            f"--budget {text} is under {MIN_BUDGET_S} s, less than the 5 pairs that decide one candidate take: give at least "
            f"{MIN_BUDGET_S}s (10m tunes the default workloads on 2 cores)"
        )
    return seconds


def check_workloads(names: Sequence[str]) -> list[str]:
    chosen = list(names) or list(TUNABLE)
    bad = [n for n in chosen if n not in TUNABLE]
    if bad:
        raise BadInput(f"--workloads: {', '.join(bad)} cannot be tuned; the workloads tune measures: {', '.join(TUNABLE)}")
    return chosen


def check_knobs(names: Sequence[str], workloads: Sequence[str]) -> list[str]:
    searchable = sorted({k for w in workloads for k in knob_table.searchable(BY_NAME[w].KNOBS)})
    bad = [n for n in names if n not in searchable]
    if bad:
        raise BadInput(
            f"--knobs: {', '.join(bad)} is not a knob of {', '.join(workloads)}; tune can search: {', '.join(searchable)}"
        )
    return list(names)


def vars_file(inventory: Path, host: str) -> Path:
    """host_vars/HOST.yml beside the inventory (a file's directory, or the directory itself)."""
    base = inventory if inventory.is_dir() else inventory.parent
    return base / "host_vars" / f"{host}.yml"


def check_writable(inventory: Path, hosts: Sequence[str]) -> None:
    """--write refused before any host is touched when a host's vars file (with several hosts, also
    group_vars and the inventory, where a class's group goes) could not be written: tried
    for real (a temporary file where it would go), as permissions alone do not say it for root."""
    targets = [vars_file(inventory, host) for host in hosts]
    if len(hosts) > 1:  # a class of several hosts goes into a group: its group_vars and the inventory
        targets.append(group_file(inventory, class_group("probe")))  # its directory: the name is known after the facts
        targets.append(inventory / CLASSES_FILE if inventory.is_dir() else inventory)
    for path in targets:
        where = path.parent if path.exists() else next((p for p in path.parents if p.exists()), path.parent)
        try:
            if not where.is_dir():
                raise NotADirectoryError(f"{where} is not a directory")
            with tempfile.TemporaryFile(dir=where):
                pass
            if path.exists():
                with path.open("a", encoding="utf-8"):
                    pass
        except OSError as exc:
            raise BadInput(
                f"--write cannot write {path} ({exc.strerror or exc}): make it writable, or tune without --write "
                "and copy the proposal"
            ) from None
        if path.exists() and path.suffix in (".yml", ".yaml"):
            _load(path)  # a file it could not edit (not one mapping: a list, a vault, several documents) refused now


def _yaml() -> Any:
    from ruamel.yaml import YAML

    yaml = YAML()  # round trip: comments, order and quoting kept
    yaml.preserve_quotes = True
    yaml.explicit_start = True  # every inventory file here starts with ---, as yamllint asks
    yaml.width = 4096  # an evidence line stays one line
    yaml.indent(mapping=2, sequence=4, offset=2)
    return yaml


def _load(path: Path) -> Any:
    """A host_vars file as ruamel's round-trip mapping (None when empty); refused when it is not one."""
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.error import YAMLError

    try:
        doc = _yaml().load(path.read_text(encoding="utf-8"))
    except YAMLError as exc:
        raise BadInput(f"--write cannot edit {path}: {str(exc).splitlines()[0]}; fix it, or tune without --write") from None
    if doc is not None and not isinstance(doc, CommentedMap):
        raise BadInput(f"--write: {path} is not a mapping of variables (a list, or a vault?); fix it or tune without --write")
    return doc


def fingerprint(hardware: Mapping[str, Any]) -> str:
    """A hardware class: the CPU model, cores, sockets, threads, the memory, the drives' models and sizes."""
    cpu = hardware.get("cpu", {})
    drives = sorted(
        (d.get("model") or "", int(d.get("size_bytes") or 0))
        for d in hardware.get("block_devices", [])
        if d.get("type", "disk") == "disk" and not d.get("loop")
    )
    key = {
        "cpu": [cpu.get("model_name"), cpu.get("sockets"), cpu.get("cores"), cpu.get("threads")],
        "memory_gib": round(int(hardware.get("memory", {}).get("total_bytes") or 0) / 2**30),
        "drives": drives,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def classes(hardware_by_host: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """Fingerprint -> its hosts, sorted; the first host of each class is the one measured."""
    out: dict[str, list[str]] = {}
    for host in sorted(hardware_by_host):
        out.setdefault(fingerprint(hardware_by_host[host]), []).append(host)
    return out


@dataclass
class Row:
    """One knob on one host: the rule's value, the tuned one (None: the rule stays) and its evidence."""

    host: str
    workload: str
    knob: str
    rule: Any
    tuned: Any = None
    gain: float | None = None
    spread: float | None = None
    pairs: int = 0
    reason: str = ""
    measured_on: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def kept(self) -> bool:
        return self.gain is not None

    def evidence(self, day: str) -> str:
        where = f", measured on {self.measured_on}" if self.measured_on and self.measured_on != self.host else ""
        return (
            f"{self.gain:.2f}x over the rule's {self.rule} on {self.workload} ({self.pairs} pairs, "
            f"spread {self.spread or 0:.0%}, {day}{where})"
        )


def rows(host: str, result: Mapping[str, Any], measured_on: str = "") -> list[Row]:
    """A host's tune result as rows, one per knob measured."""
    out = []
    for workload, entry in result.get("workloads", {}).items():
        for knob, record in entry.get("knobs", {}).items():
            if "skipped" in record:
                out.append(Row(host, workload, knob, None, reason=record["skipped"], measured_on=measured_on))
                continue
            history = record.get("candidates", [])
            row = Row(host, workload, knob, record.get("rule"), history=history, measured_on=measured_on)
            tuned = record.get("tuned")
            if tuned:
                row.tuned, row.gain, row.spread, row.pairs = tuned["value"], tuned["gain"], tuned["spread"], tuned["pairs"]
                row.reason = "kept"
            else:
                said = [f"{c.get('label')}: {c.get('reason') or c.get('error')}" for c in history]
                row.reason = "; ".join(said) or "no candidate"
            out.append(row)
    return out


def write(inventory: Path, host: str, kept: Sequence[Row], day: str | None = None) -> Path | None:
    """Put the kept rows into host_vars/HOST.yml as plan_<knob> and plan_tuned entries; the rest of
    the file as it was. None when nothing was kept."""
    if not kept:
        return None
    path = vars_file(inventory, host)
    _write_vars(path, kept, day or date.today().isoformat())
    return path


def _write_vars(path: Path, kept: Sequence[Row], day: str) -> None:
    """The kept rows into the vars file PATH (host_vars or group_vars) in a round trip."""
    from ruamel.yaml.comments import CommentedMap

    target = path.resolve() if path.is_symlink() else path  # a linked file is edited where it lies
    doc = _load(target) if target.exists() else None
    if doc is None:
        doc = CommentedMap()
    tuned = doc.get("plan_tuned")
    if tuned is None:
        tuned = CommentedMap()
    for row in kept:
        option = knob_table.KNOBS[row.knob].option
        new = option not in doc
        doc[option] = row.tuned
        if new:  # a key of the user's keeps its own comment (and the lines below it)
            doc.yaml_add_eol_comment(f"provisioner tune {day}: the rule was {row.rule}", option)
        tuned[row.knob] = row.evidence(day)
    doc["plan_tuned"] = tuned
    target.parent.mkdir(parents=True, exist_ok=True)
    text = io.StringIO()
    _yaml().dump(doc, text)
    # The file's mode and owner stay (host_vars may hold secrets: 0600).
    paths.replace_file(target, text.getvalue().encode("utf-8"))


# ---------------------------------------------------------------- a class's group

# The inventory file a directory inventory gets for the classes' groups (Ansible reads every file of
# an inventory directory, so the user's own files are not edited).
CLASSES_FILE = "provisioner-classes.yml"


def class_group(print_: str) -> str:
    """The inventory group of one hardware class: hw_ and its fingerprint (a valid group name)."""
    return f"hw_{print_}"


def group_file(inventory: Path, group: str) -> Path:
    """group_vars/GROUP.yml beside the inventory."""
    base = inventory if inventory.is_dir() else inventory.parent
    return base / "group_vars" / f"{group}.yml"


def _inventory_kind(inventory: Path) -> str:
    """dir, yaml or ini: how the class's group is added; other (a script, an inventory plugin's
    configuration) takes no group, and its members get host_vars."""
    if inventory.is_dir():
        return "dir"
    if os.access(inventory, os.X_OK):
        return "other"  # a dynamic inventory script
    if inventory.suffix in (".yml", ".yaml", ".json"):
        doc = _load(inventory)
        return "other" if doc is not None and "plugin" in doc else "yaml"
    return "ini"


def _add_yaml_group(path: Path, group: str, members: Sequence[str], note: str) -> bool:
    """GROUP (its hosts MEMBERS) as a top-level group of the YAML inventory PATH; True when it changed."""
    from ruamel.yaml.comments import CommentedMap

    doc = _load(path) if path.exists() else None
    if doc is None:
        doc = CommentedMap()
    entry = doc.get(group)
    if entry is None:
        entry = CommentedMap()
        doc[group] = entry
        doc.yaml_set_comment_before_after_key(group, before=note)
    hosts = entry.get("hosts")
    if hosts is None:
        hosts = CommentedMap()
        entry["hosts"] = hosts
    missing = [m for m in members if m not in hosts]
    if not missing and path.exists():
        return False
    for member in missing:
        hosts[member] = None
    text = io.StringIO()
    _yaml().dump(doc, text)
    path.parent.mkdir(parents=True, exist_ok=True)
    paths.replace_file(path, text.getvalue().encode("utf-8"))
    return True


def _add_ini_group(path: Path, group: str, members: Sequence[str], note: str) -> bool:
    """GROUP's section in the INI inventory PATH, its missing MEMBERS added; the rest of the file as it was."""
    lines = path.read_text(encoding="utf-8").splitlines()
    header = f"[{group}]"
    at = next((i for i, line in enumerate(lines) if line.strip() == header), None)
    if at is None:
        block = ["", f"# {note}", header, *members]
        lines += block
    else:
        end = next((i for i in range(at + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
        listed = {line.split()[0] for line in lines[at + 1 : end] if line.strip() and not line.lstrip().startswith(("#", ";"))}
        missing = [m for m in members if m not in listed]
        if not missing:
            return False
        while end > at + 1 and not lines[end - 1].strip():
            end -= 1  # after the section's last host, not after its trailing blank lines
        lines[end:end] = missing
    paths.replace_file(path, ("\n".join(lines) + "\n").encode("utf-8"))
    return True


def write_class(
    inventory: Path, print_: str, members: Sequence[str], kept: Sequence[Row], day: str | None = None
) -> tuple[list[Path], list[str]]:
    """A class of several hosts measured on its first: the kept rows into group_vars of the class's
    group (hw_FINGERPRINT), and the group with its members into the inventory (a YAML or INI file
    edited in place, comments kept; a directory gets provisioner-classes.yml). An inventory that
    cannot take a group (a script, an inventory plugin) gets each member's host_vars instead.
    Returns the files written and what to tell the user."""
    if not kept:
        return [], []
    day = day or date.today().isoformat()
    group = class_group(print_)
    kind = _inventory_kind(inventory)
    if kind == "other":
        written = [p for host in members if (p := write(inventory, host, kept, day))]
        return written, [
            f"{inventory} takes no group from a file edit (a script or a plugin): each member's host_vars got the values"
        ]
    note = (
        f"provisioner tune {day}: hosts of one hardware class (CPU, cores, memory, drives), measured on "
        f"{members[0]}; their tuned values are in group_vars/{group}.yml"
    )
    changed = (
        _add_yaml_group(inventory / CLASSES_FILE, group, members, note)
        if kind == "dir"
        else _add_yaml_group(inventory, group, members, note)
        if kind == "yaml"
        else _add_ini_group(inventory, group, members, note)
    )
    path = group_file(inventory, group)
    _write_vars(path, kept, day)
    written = [path] + ([inventory / CLASSES_FILE if kind == "dir" else inventory] if changed else [])
    # Ansible gives a host's own host_vars precedence over any group's: such a value stays.
    messages = []
    for host in members:
        own = vars_file(inventory, host)
        doc = _load(own.resolve()) if own.exists() else None
        shadowed = sorted(
            knob_table.KNOBS[r.knob].option for r in kept if doc is not None and knob_table.KNOBS[r.knob].option in doc
        )
        if shadowed:
            messages.append(
                f"{host}: {own} sets {', '.join(shadowed)} itself, which wins over the class's group_vars/{group}.yml; "
                "remove it there to take the tuned value"
            )
    return written, messages
