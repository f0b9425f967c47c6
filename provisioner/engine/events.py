"""ansible-runner's event stream folded into per-host results: counters, facts, changes with
their diffs, warnings, and failures told apart (bad input, unreachable, failed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..runs import WARNING_PREFIX, Change, Diff, HostResult, ProgressCallback
from .ssh import explain_unreachable

# A play-level variable that marks a play as the input check: read-only (the plan, every
# role's preflight), so any failure in it is bad input refused before a host was changed.
INPUT_CHECK_VAR = "provisioner_input_check"

# A run's event files (ansible-runner's job_events, a few KB each): about 2.5 per task and host,
# 15 MB for site.yml on four hosts. Above this many hosts only the events that tell something
# are written (failures, unreachable hosts, changes); stdout keeps the whole run's log either way.
KEEP_ALL_EVENTS_HOSTS = 50
_ROUTINE_EVENTS = frozenset(
    {"runner_on_start", "runner_on_ok", "runner_on_skipped", "runner_item_on_ok", "runner_item_on_skipped", "verbose"}
)


def input_check_plays(book: Path) -> frozenset[int]:
    """Positions (0-based, in run order) of the plays of a playbook that set INPUT_CHECK_VAR."""
    marked: list[bool] = []

    def walk(path: Path) -> None:
        for play in yaml.safe_load(path.read_text()) or []:
            imported = play.get("import_playbook") or play.get("ansible.builtin.import_playbook")
            if imported:
                walk(path.parent / imported)
            else:
                marked.append(bool((play.get("vars") or {}).get(INPUT_CHECK_VAR)))

    walk(book)
    return frozenset(i for i, m in enumerate(marked) if m)


class _EventCollector:
    """Folds ansible-runner events into per-host counters, facts, diffs and errors."""

    def __init__(
        self,
        on_progress: ProgressCallback | None,
        input_plays: frozenset[int] = frozenset(),
        keep_routine: bool = True,
        accept_new_host_keys: bool = False,
    ):
        self.on_progress = on_progress
        self.accept_new_host_keys = accept_new_host_keys
        self.input_plays = input_plays
        self.keep_routine = keep_routine  # write every event to the artifacts, not only what tells something
        self.plays: dict[str, int] = {}  # play uuid -> position in the run
        self.hosts: dict[str, HostResult] = {}
        self.facts: dict[str, dict[str, Any]] = {}
        self.changes: list[Change] = []
        self.reached: dict[str, int] = {}  # host -> the furthest play it ran a task in

    def mark_not_reached(self) -> None:
        """Hosts a stopped rolling run never got to: neither failed nor unreachable, yet short
        of the furthest play another host ran (their batch came after the roll stopped)."""
        furthest = max(self.reached.values(), default=-1)
        for name, host in self.hosts.items():
            if not host.failed and not host.unreachable and self.reached.get(name, -1) < furthest:
                host.not_reached = True

    def _host(self, name: str) -> HostResult:
        if name not in self.hosts:
            self.hosts[name] = HostResult(host=name)
        return self.hosts[name]

    def handle(self, event: dict[str, Any]) -> bool:
        """Fold one event in; True when ansible-runner should write it to the artifacts."""
        self._fold(event)
        if self.keep_routine or event.get("event") not in _ROUTINE_EVENTS:
            return True
        return bool(((event.get("event_data") or {}).get("res") or {}).get("changed"))

    def _fold(self, event: dict[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data", {}) or {}
        if kind == "playbook_on_play_start":
            # A play run in batches (serial) starts again under "<uuid>_<n>": the same play.
            self.plays.setdefault(_play_id(data), len(self.plays))
        host_name = data.get("host")
        if not host_name or not kind.startswith("runner_"):
            return
        host = self._host(host_name)
        task = data.get("task", "")
        res = data.get("res", {}) or {}
        if kind == "runner_on_start":
            host.task = task
            position = self.plays.get(_play_id(data), -1)
            self.reached[host_name] = max(self.reached.get(host_name, -1), position)
        elif kind == "runner_on_ok":
            self._ok(host, task, res)
            self._warning(host, data, res)
        elif kind == "runner_item_on_ok":
            self._warning(host, data, res)
        elif kind == "runner_on_failed":
            if data.get("ignore_errors"):
                host.ok += 1
            else:
                host.failed += 1
                if self._is_input_check(data):
                    host.refused += 1
                host.errors.append(f"{task}: {_failure_message(res)}")
        elif kind == "runner_on_unreachable":
            host.unreachable += 1
            host.errors.append(explain_unreachable(host_name, res.get("msg", ""), self.accept_new_host_keys))
        elif kind == "runner_on_skipped":
            host.skipped += 1
        elif kind == "runner_item_on_failed":
            return
        if self.on_progress:
            self.on_progress(host)

    def _ok(self, host: HostResult, task: str, res: dict[str, Any]) -> None:
        if res.get("changed"):
            host.changed += 1
        else:
            host.ok += 1
        if res.get("ansible_facts"):
            self.facts.setdefault(host.host, {}).update(res["ansible_facts"])
        if res.get("changed"):
            self.changes.append(Change(host.host, task, diffs_of(res.get("diff"))))

    @staticmethod
    def _warning(host: HostResult, data: dict[str, Any], res: dict[str, Any]) -> None:
        """A role's warning: a debug message with WARNING_PREFIX (a loop's come one per item)."""
        action = str(data.get("resolved_action") or data.get("task_action") or "")
        msg = res.get("msg")
        if action.endswith("debug") and isinstance(msg, str) and msg.startswith(WARNING_PREFIX):
            host.warnings.append(msg[len(WARNING_PREFIX) :].strip())

    def _is_input_check(self, data: dict[str, Any]) -> bool:
        """Bad input: a failure in a play marked as the input check, or a role's argument spec refusing an option."""
        validation = str(data.get("resolved_action") or data.get("task_action") or "").endswith("validate_argument_spec")
        return validation or self.plays.get(_play_id(data)) in self.input_plays


def _play_id(data: dict[str, Any]) -> str:
    return str(data.get("play_uuid") or data.get("uuid") or "").split("_", 1)[0]


def diffs_of(raw: Any) -> list[Diff]:
    """Ansible's diff results (a dict or a list of them) as before/after text."""
    out = []
    for d in raw if isinstance(raw, list) else [raw] if raw else []:
        if not isinstance(d, dict):
            continue
        if "prepared" in d:
            out.append(Diff(text=str(d["prepared"]).rstrip()))
            continue
        before, after = d.get("before", ""), d.get("after", "")
        if isinstance(before, dict) or isinstance(after, dict):
            b, a = before or {}, after or {}
            keys = sorted(k for k in set(b) | set(a) if b.get(k) != a.get(k))
            before = "".join(f"{k}: {b.get(k)!r}\n" for k in keys)
            after = "".join(f"{k}: {a.get(k)!r}\n" for k in keys)
        out.append(Diff(str(before), str(after), str(d.get("before_header", "before")), str(d.get("after_header", "after"))))
    return out


def _failure_message(res: dict[str, Any]) -> str:
    msg = str(res.get("msg") or "").strip()
    detail = str(res.get("stderr") or "").strip().splitlines()
    if detail and detail[-1] not in msg:
        msg = f"{msg}: {detail[-1]}" if msg else detail[-1]
    items = [r for r in res.get("results") or [] if isinstance(r, dict) and r.get("failed")]
    if items:
        # A loop says only "One or more items failed": name each failed item and its reason.
        reasons = "; ".join(f"{_item_label(r)}: {_failure_message(r)}" for r in items)
        msg = f"{msg}: {reasons}" if msg else reasons
    if res.get("argument_errors"):  # a role's argument spec refused an option: name it
        msg = "invalid role options: " + "; ".join(str(e) for e in res["argument_errors"])
    return msg.splitlines()[0] if msg else "failed"


def _item_label(res: dict[str, Any]) -> str:
    """How a loop item shows itself: its loop_control label, else the item."""
    label = res.get("_ansible_item_label", res.get("item", "?"))
    return str(label)
