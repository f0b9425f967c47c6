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

import contextlib
import io
import re
import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import Any

from provisioner import paths
from provisioner.errors import BadInput
from provisioner.smoke.workloads import BY_NAME
from provisioner.tune import classes
from provisioner.tune import knobs as knob_table

# Workloads with a tune objective, in the order they run; the default of --workloads leaves out those
# tuned only when named (TUNE_WHEN_NAMED: the Parquet scan drops the host's page cache for each
# measurement, TensorFlow is an opt-in component).
TUNABLE: tuple[str, ...] = tuple(name for name, w in BY_NAME.items() if getattr(w, "TUNE", None) is not None)
DEFAULT_TUNED: tuple[str, ...] = tuple(n for n in TUNABLE if not getattr(BY_NAME[n], "TUNE_WHEN_NAMED", False))
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
    chosen = list(names) or list(DEFAULT_TUNED)
    bad = [n for n in chosen if n not in TUNABLE]
    if bad:
        raise BadInput(f"--workloads: {', '.join(bad)} cannot be tuned; the workloads tune measures: {', '.join(TUNABLE)}")
    return chosen


def check_knobs(names: Sequence[str], workloads: Sequence[str]) -> list[str]:
    searchable = sorted({k for w in workloads for k in knob_table.searchable(BY_NAME[w].KNOBS)})
    bad = [n for n in names if n not in searchable]
    named_only = sorted(
        {
            w
            for n in bad
            for w in TUNABLE
            if w not in DEFAULT_TUNED and w not in workloads and n in knob_table.searchable(BY_NAME[w].KNOBS)
        }
    )
    if bad and named_only:
        raise BadInput(
            f"--knobs: {', '.join(bad)} is a knob of {', '.join(named_only)}, tuned only when named: "
            f"add --workloads {','.join(named_only)}"
        )
    if bad:
        raise BadInput(
            f"--knobs: {', '.join(bad)} is not a knob of {', '.join(workloads)}; tune can search: {', '.join(searchable)}"
        )
    return list(names)


def vars_file(inventory: Path, host: str) -> Path:
    return classes.vars_beside(inventory, "host_vars", host)


def check_writable(inventory: Path, hosts: Sequence[str]) -> None:
    """--write refused before any host is touched when a host's vars file (with several hosts, also
    the group_vars directory a class's group would get) could not be written: tried for real (a
    temporary file where it would go), as permissions alone do not say it for root."""
    targets = [vars_file(inventory, host) for host in hosts]
    if len(hosts) > 1:
        targets.append(classes.group_file(inventory, classes.class_group("probe")))  # its directory: names come later
    for path in targets:
        _try_writing(path)


def check_class_writable(inventory: Path, groups: Mapping[str, Sequence[str]]) -> None:
    """With the classes known (the facts read, nothing measured yet): each class of several hosts'
    group_vars file, and the inventory file its group goes into, refused now if it could not be written."""
    several = [print_ for print_, members in groups.items() if len(members) > 1]
    if not several:
        return
    for print_ in several:
        _try_writing(classes.group_file(inventory, classes.class_group(print_)))
    if classes.kind(inventory) != "other":  # other: each member's host_vars, checked before
        _try_writing(classes.edited_file(inventory))


def _try_writing(path: Path) -> None:
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
    if path.exists() and path.parent.name in ("host_vars", "group_vars"):
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


def write_class(
    inventory: Path,
    print_: str,
    measured: Sequence[Row],
    members: Sequence[str],
    day: str | None = None,
    placement: Mapping[str, str] | None = None,
) -> tuple[list[Path], list[str]]:
    """A class of several hosts measured on its first: its kept rows (MEASURED, the measured host's)
    into group_vars of the class's group, and the group with its MEMBERS into the inventory
    (provisioner.tune.classes). An inventory that cannot take a group gets each member's host_vars.
    Returns the files written and what to tell the user: the inventory's hosts where Ansible's
    precedence gives another value or evidence than the class's, and the group's hosts this run did
    not reach (outside --limit) that get the values too. PLACEMENT: every host the run reached ->
    its class's group (default: the members in this one)."""
    kept = [r for r in measured if r.kept]
    if not kept:
        return [], []
    day = day or date.today().isoformat()
    group = classes.class_group(print_)
    note = (
        f"{classes.NOTE} {day}: hosts of one hardware class (CPU, cores, memory, drives), measured on "
        f"{members[0]}; their tuned values are in group_vars/{group}.yml"
    )
    placed = dict(placement or {}) | {m: group for m in members}
    try:
        changed, earlier = classes.regroup(inventory, placed, (group, members, note))
    except classes.CannotGroup as exc:
        written = [p for host in members if (p := write(inventory, host, [replace(r, host=host) for r in kept], day))]
        said = [f"{exc}: each member's host_vars got the values instead"]
        wanted_options = {knob_table.KNOBS[r.knob].option for r in kept}
        from ansible.errors import AnsibleError

        # Unreadable: the host_vars were written, and `provisioner plan` shows what each host gets.
        with contextlib.suppress(AnsibleError):
            said += _other_servers(classes.read_vars(inventory, list(members)), members[0], wanted_options)
        return written, said
    path = classes.group_file(inventory, group)
    _write_vars(path, [replace(r, host=group) for r in kept], day)
    written = [path] + ([classes.edited_file(inventory)] if changed else [])
    messages = []
    if earlier:
        messages.append(
            f"{', '.join(earlier)}: in group {group} from an earlier tune and not reached by this one (--limit), "
            "they get these values too"
        )
    # What Ansible gives each host of the group: a host's own host_vars, a host line of the inventory
    # or a deeper group ranks above the class's group, and a plan_tuned of its own replaces the group's.
    wanted = {knob_table.KNOBS[r.knob].option: (r.knob, r.tuned) for r in kept}
    evidence = {r.knob: replace(r, host=group).evidence(day) for r in kept}
    from ansible.errors import AnsibleError

    try:
        found_vars = classes.read_vars(inventory, [*members, *earlier])
    except AnsibleError as exc:
        messages.append(
            f"the hosts' variables could not be read back ({str(exc).splitlines()[0]}): see them with provisioner plan"
        )
        found_vars = {}
    for host, found in found_vars.items():
        other = [o for o, (_k, v) in wanted.items() if found.get(o) != v]
        tuned = found.get("plan_tuned")
        theirs: Mapping[str, Any] = tuned if isinstance(tuned, Mapping) else {}
        stale = [k for o, (k, _v) in wanted.items() if o not in other and theirs.get(k) != evidence[k]]
        if other:
            messages.append(
                f"{host}: {', '.join(f'{o} is {found.get(o)!r}' for o in other)} there, from its host_vars, its inventory "
                f"line or a deeper group, which Ansible ranks above group {group}; remove it there to take the tuned value"
            )
        if stale:
            messages.append(
                f"{host}: a plan_tuned of its own (host_vars) replaces the class's, so `provisioner plan` shows other "
                f"evidence for {', '.join(stale)}; remove plan_tuned there"
            )
    messages += _other_servers(found_vars, members[0], wanted)
    return written, messages


# The model server's shape and allocator: a kept value of one was measured beside the others as the
# measured host's options left them (provisioner.tune.knobs.planned), and only where the plan takes it
# back (the cores unless oversubscription is allowed, each worker's share of the memory budget).
SERVER_SHAPE = ("plan_serving_workers", "plan_serving_threads_per_worker", "plan_serving_allocator")
SERVER_BOUNDS = (
    "serving_jemalloc",  # outranks plan_serving_allocator: a member's own runs another allocator
    "plan_allow_oversubscription",
    "plan_serving_memory_share",
    "plan_hugepages_size",
    "plan_hugepages_count",
    "plan_hugepages_share",
)


def _other_servers(found_vars: Mapping[str, Mapping[str, Any]], measured: str, wanted: Collection[str]) -> list[str]:
    """The class's hosts whose own option of the model server's shape or bounds differs from the
    measured host's while the class keeps a count of it: their plan gives another server than was
    measured, or refuses the count."""
    if not any(o in wanted for o in SERVER_SHAPE) or measured not in found_vars:
        return []
    shape = {o: found_vars[measured].get(o) for o in (*SERVER_SHAPE, *SERVER_BOUNDS) if o not in wanted}
    out = []
    for host, found in found_vars.items():
        differs = [o for o, v in shape.items() if found.get(o) != v]
        if host != measured and differs:
            said = ", ".join(f"{o} is {found.get(o)!r} there, {shape[o]!r} on {measured}" for o in differs)
            out.append(
                f"{host}: {said}, where the model server was measured; its plan gives another server than the one "
                f"measured, or refuses it: set it as on {measured}, or tune {host} on its own"
            )
    return out


def prune(inventory: Path, placement: Mapping[str, str]) -> list[str]:
    """After a --write run: every host it reached out of the classes' groups but its own class's
    (a host whose hardware changed, a class of one, a class that kept nothing); what to tell."""
    try:
        changed, _ = classes.regroup(inventory, placement)
    except classes.CannotGroup as exc:
        return [] if classes.kind(inventory) == "other" else [f"the classes' groups were left as they were: {exc}"]
    return [f"{classes.edited_file(inventory)}: the classes' groups follow the hosts' hardware now"] if changed else []
