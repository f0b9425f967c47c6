"""Terminal rendering with rich: tables, live progress, diffs, from plain data; knows nothing of Ansible."""

from __future__ import annotations

import difflib
import json
import signal
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from rich.console import Console, ConsoleDimensions
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .runs import NOT_REACHED, Diff, HostResult, RunResult, failures_first

if TYPE_CHECKING:
    from .commands import FactsOutcome, StatusRun, UndoOutcome, UpOutcome
    from .verify import VerifyResult

# Width of the output when it goes to a pipe, a file or a CI log: wide enough that a table
# keeps each row on one line (a terminal's own width applies on a terminal; COLUMNS wins).
PIPE_WIDTH = 1000


class _Console(Console):
    """A rich console that does not wrap at 80 columns when its output is not a terminal."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self._width is None and not self.is_terminal and "COLUMNS" not in self._environ:
            return ConsoleDimensions(PIPE_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


def make_console(**kwargs: Any) -> Console:
    return _Console(**kwargs)


console = make_console()
err_console = make_console(stderr=True)

_STATUS_STYLE = {
    "ok": "green",
    "changed": "yellow",
    "failed": "red",
    "refused": "red",
    "unreachable": "red",
    NOT_REACHED: "red",
    "passed": "green",
    "skipped": "dim",
}


def print_json(data: Any) -> None:
    # Plain print: JSON must not be wrapped or coloured.
    print(json.dumps(data, indent=2, default=str))


def error(message: str) -> None:
    # soft_wrap: an error stays one line whatever the terminal width.
    err_console.print(Text("error: ", style="bold red") + Text(message), soft_wrap=True)


# Rows of the live table: a fleet's hosts beyond these are counted in its title, not drawn.
PROGRESS_ROWS = 20


def _progress_table(hosts: dict[str, HostResult]) -> Table:
    """The hosts heard from so far, failures first; a fleet shows its first PROGRESS_ROWS."""
    shown = failures_first(hosts.values())
    failing = sum(h.status in ("unreachable", "failed", "refused") for h in shown)
    # Short: a title wraps at the table's width.
    title = f"{len(shown)} host{'s' if len(shown) != 1 else ''}" + (f", {failing} failing" if failing else "")
    if len(shown) > PROGRESS_ROWS:
        title += f", {PROGRESS_ROWS} shown"
    table = Table(title=title, expand=False)
    for col in ("host", "task", "ok", "changed", "failed", "unreachable"):
        table.add_column(col, justify="right" if col not in ("host", "task") else "left")
    for h in shown[:PROGRESS_ROWS]:
        table.add_row(Text(h.host), Text(h.task), str(h.ok), str(h.changed), str(h.failed), str(h.unreachable))
    return table


@contextmanager
def live_progress(enabled: bool) -> Iterator[Any]:
    """Yields a callback for engine progress; draws a per-host live table while enabled."""
    hosts: dict[str, HostResult] = {}
    if not enabled:
        yield None
        return
    with Live(_progress_table(hosts), console=console, refresh_per_second=8, transient=True) as live:

        def update(host: HostResult) -> None:
            hosts[host.host] = host
            live.update(_progress_table(hosts))

        yield update


def summary_title(result: RunResult) -> str:
    """The playbook, its host count, the hosts in each status that occurred, and the batches of a rolling run."""
    counts = result.counts()
    total = counts.pop("hosts")
    shown = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
    title = f"{result.playbook} on {total} host{'s' if total != 1 else ''}" + (f": {shown}" if shown else "")
    if result.batch:
        title += f" (batches of {result.batch['hosts_per_batch']}"
        if "max_fail_percentage" in result.batch:
            title += f", stop above {result.batch['max_fail_percentage']}% failed"
        title += ")"
    if result.check:
        title += " (check mode: nothing was changed)"
    if result.interrupted:
        title += f": interrupted by {signal.Signals(result.interrupted).name}, stopped before the end"
    return title


def run_summary(result: RunResult) -> None:
    """One row per host, failures first (unreachable, failed, refused, not reached), then changed and ok.
    The title is a line of its own: a fleet's counts would wrap as a title as narrow as the table."""
    console.print(Text(summary_title(result), style="bold"), soft_wrap=True)
    table = Table()
    for col in ("host", "status", "ok", "changed", "failed", "unreachable", "skipped"):
        table.add_column(col, justify="left" if col in ("host", "status") else "right")
    for h in failures_first(result.hosts.values()):
        table.add_row(
            Text(h.host),
            Text(h.status, style=_STATUS_STYLE.get(h.status, "")),
            str(h.ok),
            str(h.changed),
            str(h.failed),
            str(h.unreachable),
            str(h.skipped),
        )
    console.print(table)
    console.print(Text(f"{result.seconds:.1f} s; log: {result.artifact_dir}", style="dim"))


def changes(result: RunResult) -> None:
    """What changed (or would change, in check mode), with diffs where a module gives them."""
    if not result.changes:
        console.print("no changes" if not result.check else "nothing would change")
        return
    verb = "would change" if result.check else "changed"
    for c in result.changes:
        console.print(Text(f"{verb} ", style="yellow") + Text(f"{c.host}: {c.task}"))
        for d in c.diff:
            text = _diff_text(d)
            if text:
                console.print(Text(text, style="dim"))


def _diff_text(diff: Diff) -> str:
    if diff.text:
        return diff.text
    if diff.before == diff.after:
        return ""
    lines = difflib.unified_diff(
        diff.before.splitlines(), diff.after.splitlines(), diff.before_header, diff.after_header, lineterm=""
    )
    return "\n".join("  " + ln for ln in lines)


def facts(facts_by_host: dict[str, dict[str, Any]]) -> None:
    for host, f in facts_by_host.items():
        cpu, mem = f.get("cpu", {}), f.get("memory", {})
        table = Table(title=f"{host}: hardware", show_header=False)
        table.add_column("what", style="bold")
        table.add_column("value")
        isa = ", ".join(k for k, v in (cpu.get("isa") or {}).items() if v) or "none of note"
        cpufreq = f.get("cpufreq", {}) or {}
        virt = f.get("virtualization", {}) or {}
        os_ = f.get("os", {}) or {}
        rows = [
            ("cpu", f"{cpu.get('model_name')} ({cpu.get('vendor')}, family {cpu.get('family')} model {cpu.get('model')})"),
            (
                "topology",
                f"{cpu.get('sockets')} socket(s), {cpu.get('cores')} cores, {cpu.get('threads')} threads, {cpu.get('numa_nodes')} NUMA node(s)",
            ),
            ("isa", isa),
            ("caches", ", ".join(f"{k} {v}" for k, v in (cpu.get("caches") or {}).items() if v)),
            ("memory", f"{(mem.get('total_bytes') or 0) / 2**30:.1f} GiB"),
            (
                "cpufreq",
                f"{cpufreq.get('driver') or 'no cpufreq driver'}"
                + (f", governor {cpufreq.get('governor')}" if cpufreq.get("governor") else ""),
            ),
            ("thp", f"enabled={(f.get('thp') or {}).get('enabled')} defrag={(f.get('thp') or {}).get('defrag')}"),
            ("virtualization", f"{virt.get('type')} ({virt.get('role')})"),
            ("os", f"{os_.get('pretty_name')}, kernel {os_.get('kernel')}"),
        ]
        for what, value in rows:
            table.add_row(what, Text(value))
        console.print(table)
        devices = f.get("block_devices") or []
        if devices:
            dt = Table(title=f"{host}: block devices")
            for col in ("device", "size", "model", "nvme", "in use"):
                dt.add_column(col)
            for d in devices:
                used = _in_use(d)
                dt.add_row(
                    Text(str(d.get("path"))),
                    f"{(d.get('size_bytes') or 0) / 1e9:.1f} GB",
                    Text(str(d.get("model") or "")),
                    "yes" if d.get("nvme") else "no",
                    Text(used or "no"),
                )
            console.print(dt)


def _in_use(d: dict[str, Any]) -> str:
    parts = []
    if d.get("root_disk"):
        parts.append("root disk")
    if d.get("mountpoints"):
        parts.append("mounted at " + ", ".join(m for m in d["mountpoints"] if m))
    if d.get("partitions"):
        parts.append(f"{len(d['partitions'])} partition(s)")
    if d.get("signatures"):
        parts.append("holds " + ", ".join(d["signatures"]))
    if d.get("holders"):
        parts.append("held by " + ", ".join(d["holders"]))
    return "; ".join(parts)


def human_bytes(size: int | float) -> str:
    """A byte count as people read it, in binary units: 20220856800 -> '18.8 GiB'."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size) >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{int(size)} B"


def plan_value(key: str, value: Any) -> str:
    """A plan setting's value for the terminal: sizes (keys ending in _bytes) in GiB/MiB, lists
    and mappings as JSON, nothing as '-'. --json keeps the raw values."""
    if value is None:
        return "-"
    if key.endswith("_bytes") and isinstance(value, (int, float)) and not isinstance(value, bool):
        return human_bytes(value)
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def plan(plans_by_host: dict[str, dict[str, Any]]) -> None:
    for host, p in plans_by_host.items():
        table = Table(title=f"{host}: plan")
        table.add_column("setting", style="bold")
        table.add_column("value")
        table.add_column("why")
        for s in p.get("settings", []):
            shown, reason = plan_value(s["key"], s["value"]), str(s["reason"])
            if shown != str(s["value"]) and reason.startswith(f"{s['value']}: "):
                reason = reason[len(f"{s['value']}: ") :]  # the raw count again, shown better beside it
            table.add_row(s["key"], Text(shown), Text(reason))
        console.print(table)
        storage = p.get("storage")
        if storage:
            storage_proposal(storage)
        for w in p.get("warnings", []):
            console.print(Text("warning: ", style="yellow") + Text(w))


def storage_sentence(storage: dict[str, Any]) -> str:
    """The plan's storage proposal in one sentence: what array, of how many drives, where, how
    big, and whether it is confirmed; or why nothing is proposed."""
    if not storage.get("proposed"):
        return str(storage.get("reason") or "nothing proposed")
    devices = storage.get("devices") or []
    level, backend = str(storage.get("level")), str(storage.get("backend"))
    kind = f"{level} ({backend}" if level != "single" else f"one drive ({backend}"
    kind += f", {storage.get('filesystem')}" + (f", chunk {storage['chunk_kb']} KiB" if storage.get("chunk_kb") else "") + ")"
    state = (
        "confirmed"
        if storage.get("confirmed")
        else "a proposal only: nothing is built until -e storage_use_plan_proposal=true confirms it (or storage_devices names drives)"
    )
    drives = f"{len(devices)} drive{'s' if len(devices) != 1 else ''}"
    return f"{kind} of {drives} at {storage.get('mountpoint')}, {human_bytes(storage.get('usable_bytes') or 0)} usable; {state}"


def storage_proposal(storage: dict[str, Any]) -> None:
    """The storage proposal as a sentence, the drives it would use as a table, the drives it leaves
    out with their reasons."""
    console.print(Text("storage: ", style="bold") + Text(storage_sentence(storage)), soft_wrap=True)
    reason = str(storage.get("reason") or "")
    if storage.get("proposed") and "; " in reason:
        # The plan's reason starts with what the sentence says; the rest is why this level and layout.
        console.print(Text("  why: " + reason.split("; ", 1)[1], style="dim"), soft_wrap=True)
    devices = storage.get("devices") or []
    if devices:
        table = Table(title="drives proposed")
        for col in ("drive", "size", "model"):
            table.add_column(col)
        for d in devices:
            table.add_row(
                Text(str(d.get("id") or d.get("name"))), human_bytes(d.get("size_bytes") or 0), Text(str(d.get("model") or ""))
            )
        console.print(table)
    for d in storage.get("excluded") or []:
        console.print(Text(f"  left out: {d.get('path') or d.get('name')}: {d.get('reason')}", style="dim"), soft_wrap=True)


def verify_summary(result: VerifyResult, verbose: bool = False) -> None:
    """One line per host and role (passed, skipped: not configured, failed with the reasons); -v: every check."""
    if verbose:
        for host, checks in result.by_host().items():
            table = Table(title=f"{host}: verify")
            for col in ("role", "check", "result", "detail"):
                table.add_column(col)
            for c in checks:
                table.add_row(
                    Text(c.role), Text(c.check), Text(c.outcome, style=_STATUS_STYLE.get(c.outcome, "")), Text(c.message)
                )
            console.print(table)
        return
    summary = result.summary()
    if not summary:
        return
    # No title: a pipe gets the table as wide as its widest row, and a title would be padded to it.
    table = Table()
    for col in ("host", "role", "result", "detail"):
        table.add_column(col)
    for s in summary:
        first, *more = s.details
        table.add_row(Text(s.host), Text(s.role), Text(s.outcome, style=_STATUS_STYLE.get(s.outcome, "")), Text(first))
        for line in more:  # each further failure of the role on a line of its own
            table.add_row("", "", "", Text(line))
    console.print(table)


def lab_servers(servers: list[Any]) -> None:
    table = Table(title="lab servers")
    for col in ("name", "address", "state", "inventory"):
        table.add_column(col)
    for s in servers:
        table.add_row(Text(s.name), s.address, "up" if s.alive else "dead (run lab down)", Text(str(s.inventory)))
    console.print(table)


def lab_server(server: Any) -> None:
    console.print(Text(server.name, style="green") + Text(f" is up at {server.address}"))
    console.print(Text(f"  ssh:       ssh -F {server.ssh_config} {server.name}"))
    console.print(Text(f"  provision: provisioner up -i {server.inventory}"))
    console.print(Text(f"  discard:   provisioner lab down {server.name}"))


def bundle(result: Any) -> None:
    console.print(
        Text(
            f"wheelhouse {result.path}: {len(result.files)} wheels, {result.bytes / 1e6:.0f} MB "
            f"({result.downloaded} downloaded, {result.reused} reused) in {result.seconds:.1f} s"
        )
    )


def lock_update(update: Any) -> None:
    pins = ", ".join(f"{c} {n}" for c, n in update.components.items())
    console.print(Text(f"lock {update.path}: pins per component: {pins}"))


def lab_down(outcome: dict[str, Any]) -> None:
    console.print(Text(f"{outcome['name']}: {'discarded' if outcome['removed'] else 'no such lab server'}"))


def fact_run(outcome: FactsOutcome, show: Callable[[dict[str, Any]], None]) -> None:
    """A host's facts (or plans) as tables; the run's summary instead when it failed."""
    if outcome.run.exit_code != 0:
        run_summary(outcome.run)
    else:
        show(outcome.by_host())


def up(outcome: UpOutcome, verbose: bool = False) -> None:
    """Every step that ran: the changes (check mode, -v), the runs, verify, the smoke test."""
    if outcome.run.check or verbose:
        changes(outcome.run)
    run_summary(outcome.run)
    if outcome.rebooted is not None:
        run_summary(outcome.rebooted)
    if outcome.verified is not None:
        verify_summary(outcome.verified, verbose)
    if outcome.smoked is not None:
        smoke_run(outcome.smoked)


def undo(outcome: UndoOutcome) -> None:
    """The restore's changes and summary, then the reboot's summary when hosts were rebooted."""
    changes(outcome.run)
    run_summary(outcome.run)
    if outcome.rebooted is not None:
        run_summary(outcome.rebooted)


_SETTING_STYLE = {"ok": "green", "drifted": "red", "not applicable": "dim"}


def status(result: StatusRun) -> None:
    """One table per host: every managed setting, drifted first, with the expected and the live value."""
    if result.run.exit_code != 0:
        run_summary(result.run)
    for host, h in result.hosts.items():
        took = f", {h.seconds:.1f} s" if h.seconds is not None else ""
        table = Table(title=f"{host}: status ({len(h.drifted)} drifted{took})", title_justify="left")
        for col in ("role", "setting", "expected", "live", "state", "reason"):
            table.add_column(col, overflow="fold")
        for s in h.settings:
            state = str(s.get("state", ""))
            reason = Text(str(s.get("reason") or ""))
            if s.get("repair"):  # a file provisioner does not own sets the value: what fixes it
                reason.append(("\n" if reason else "") + str(s["repair"]), style="yellow")
            table.add_row(
                Text(str(s.get("role", ""))),
                Text(str(s.get("name", ""))),
                Text(_shown(s.get("expected"))),
                Text(_shown(s.get("live"))),
                Text(state, style=_SETTING_STYLE.get(state, "")),
                reason,
            )
        console.print(table)


def serve_status(result: Any) -> None:
    """One table per host: each model-server worker's unit, slice, models, cache and load."""
    if result.run.exit_code != 0:
        run_summary(result.run)
    for host, data in result.hosts.items():
        workers = data.get("workers", [])
        table = Table(
            title=f"{host}: model server on {data.get('listen')} ({len(workers)} workers, "
            f"{data.get('requests_per_s', 0):g} requests/s)",
            title_justify="left",
        )
        for col in ("worker", "unit", "cpus", "threads", "loaded versions", "cache", "requests/s", "errors/s", "restarts"):
            table.add_column(col, overflow="fold")
        for w in workers:
            healthy = w.get("active") == "active" and w.get("answering") and w.get("ready")
            state = f"{w.get('active')}" + ("" if w.get("answering") else " (not answering)")
            if w.get("answering") and not w.get("ready"):
                state += " (not ready)"
            cache = "-"
            if w.get("cache_bytes") is not None:
                cache = f"{_mib(w.get('cache_bytes'))} of {_mib(w.get('cache_budget_bytes'))}"
            table.add_row(
                str(w.get("index")),
                Text(state, style="green" if healthy else "red"),
                ",".join(str(c) for c in w.get("cpus") or []) or "all",
                str(w.get("threads")),
                Text(" ".join(_with_engine(v, (w.get("engines") or {}).get(v)) for v in w.get("loaded_versions") or []) or "-"),
                cache,
                _shown(w.get("requests_per_s")),
                _shown(w.get("errors_per_s")),
                _shown(w.get("restarts")),
            )
        console.print(table)


def _with_engine(version: str, engine: Any) -> str:
    """A loaded version with what predicts it and its single-row time: "m/3 (onedal 12 µs)"."""
    if not isinstance(engine, dict) or not engine.get("engine"):
        return version
    us = engine.get("predict_us")
    return f"{version} ({engine['engine']}" + (f" {us:.0f} µs)" if isinstance(us, int | float) else ")")


def _mib(value: Any) -> str:
    return "-" if value is None else f"{int(value) / 2**20:.0f} MiB"


def _shown(value: Any) -> str:
    return "-" if value is None else value if isinstance(value, str) else json.dumps(value)


def notes(messages: Iterable[str], errors: Iterable[str]) -> None:
    """A result's messages (stdout) and its errors (stderr, one line each)."""
    for m in messages:
        console.print(Text(m, style="yellow"))
    for e in errors:
        error(e)


_SMOKE_STYLE = {"pass": "green", "warn": "yellow", "fail": "red", "skip": "dim", "info": "cyan"}


def smoke_run(result: Any) -> None:
    """A smoke run: the playbook's summary when it failed, then the hosts' tables."""
    if result.run.exit_code != 0:
        run_summary(result.run)
    smoke(result.reports)


def smoke(reports: list[Any]) -> None:
    """One table per host: figure, limit, ratio, before/after, status and reason."""
    from .smoke import number

    for r in reports:
        hw = r.hardware
        # No workload ran (smoke --config-only): no profile sized anything, no figure needs the peak.
        kind = r.profile if r.workloads else "configuration only"
        title = (
            f"{r.host}: smoke {kind} ({r.mode}) — {hw.get('cpu')}, {hw.get('physical_cores')} cores, "
            f"{hw.get('threads')} threads per job, {r.seconds:.0f} s"
        )
        table = Table(title=title, title_justify="left")
        columns: tuple[tuple[str, Literal["left", "right"]], ...] = (
            ("check", "left"),
            ("figure", "right"),
            ("limit", "right"),
            ("ratio", "right"),
            ("before", "right"),
            ("status", "left"),
            ("reason", "left"),
        )
        for col, just in columns:
            table.add_column(col, justify=just, overflow="fold")
        for c in r.checks:
            figure = f"{number(c.figure)} {c.unit}".strip()
            before = f"{number(c.baseline)} ({c.gain:.2f}x)" if c.baseline is not None and c.gain else ""
            table.add_row(
                Text(c.title),
                Text(figure),
                Text(number(c.limit)),
                Text(f"{c.ratio:.2f}" if c.ratio is not None else ""),
                Text(before),
                Text(c.status + (" ↓" if c.regression else ""), style=_SMOKE_STYLE.get(c.status, "")),
                Text(c.reason),
            )
        console.print(table)
        if r.workloads:
            console.print(
                Text(
                    f"  peak: {hw.get('fp64_flops_per_cycle')} FP64 FLOPs/cycle ({hw.get('fp64_basis')}); "
                    f"clock {hw.get('clock_ghz')} GHz ({hw.get('clock_basis')})",
                    style="dim",
                )
            )
        if r.baseline_started:
            console.print(Text(f"  before: the unprovisioned baseline of {r.baseline_started}", style="dim"))
        counts = r.counts()
        console.print(
            Text(
                f"  {counts['pass']} passed, {counts['warn']} warnings, {counts['fail']} failed, "
                f"{counts['skip']} skipped, {counts['info']} reported without a limit",
                style=_SMOKE_STYLE.get(r.status, ""),
            )
        )


def tune(outcome: Any) -> None:
    """The proposal: per host and knob, the rule's value, the tuned one, the gain with its spread."""
    if outcome.run is not None and outcome.run.exit_code != 0:
        run_summary(outcome.run)
    if not outcome.rows:
        return
    table = Table(title="tune: the plan's rule against the measured candidates", show_lines=False)
    for name in ("host", "workload", "knob", "rule", "tuned", "gain", "spread", "pairs", "why"):
        table.add_column(name)
    for r in outcome.rows:
        table.add_row(
            r.host,
            r.workload,
            r.knob,
            "" if r.rule is None else str(r.rule),
            str(r.tuned) if r.kept else "(rule stays)",
            f"{r.gain:.2f}x" if r.kept else "",
            f"{r.spread:.0%}" if r.kept and r.spread is not None else "",
            str(r.pairs) if r.kept else "",
            "kept" if r.kept else r.reason,
        )
    console.print(table)
