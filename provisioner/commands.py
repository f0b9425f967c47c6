"""What each command does, outside the command line: run its steps, decide its exit code.

Every function returns a `Result` (provisioner.result); the typer commands in cli.py only
parse the options, call one of these and print what it returns. Errors that stop a command
before it has anything to show (bad input, a problem on the control node) are raised as
`ProvisionerError`s and leave by the CLI's one abort path.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import engine, paths
from .errors import BadInput, ExitCode
from .reboot import RebootDecision, decide
from .result import Result, first_failure
from .runs import ProgressCallback, RunResult
from .smoke import SmokeRun
from .verify import APPLIED_OPTIONS_VAR, VerifyResult, applied_options, roles_for_tags
from .verify import verify as run_checks

# The run-wide settings the CLI sets for a command, owned by the engine: the CLI reaches the
# engine only through this module (tests/unit/test_layers.py).
DEFAULT_CONNECT_TIMEOUT = engine.DEFAULT_CONNECT_TIMEOUT
interruptible = engine.interruptible
interrupted_by = engine.interrupted
set_connect_timeout = engine.set_connect_timeout

HARDWARE_FACT = "provisioner_hardware"
PLAN_FACT = "provisioner_plan"


# ---------------------------------------------------------------- facts and plan


@dataclass
class FactsOutcome:
    """One fact of every host, from the read-only facts playbook."""

    run: RunResult
    fact: str

    def by_host(self) -> dict[str, Any]:
        return {h: f.get(self.fact, {}) for h, f in self.run.facts.items()}

    def to_dict(self) -> dict[str, Any]:
        return self.by_host()


def read_fact(command: str, fact: str, inventory: Path | None, **run_options: Any) -> Result[FactsOutcome]:
    """Run playbooks/facts.yml (changes nothing) and keep one fact of every host; `run_options`
    are engine.run_playbook's (limit, extravars, accept_new_host_keys)."""
    run = engine.run_playbook("facts.yml", engine.resolve_inventory(inventory), **run_options)
    return Result(command, FactsOutcome(run, fact), run.exit_code, errors=tuple(run.errors))


def facts(inventory: Path | None, **kwargs: Any) -> Result[FactsOutcome]:
    """Each host's hardware: CPU, ISA, caches, memory, drives, virtualization, OS."""
    return read_fact("facts", HARDWARE_FACT, inventory, **kwargs)


def plan(inventory: Path | None, **kwargs: Any) -> Result[FactsOutcome]:
    """Each host's tuning plan, each setting with its reason."""
    return read_fact("plan", PLAN_FACT, inventory, **kwargs)


# ---------------------------------------------------------------- up


@dataclass
class UpOutcome:
    """The steps of `provisioner up`, each None when it did not run."""

    run: RunResult  # site.yml
    decision: RebootDecision
    rebooted: RunResult | None = None
    verified: VerifyResult | None = None
    smoked: SmokeRun | None = None
    published: RunResult | None = None  # the smoke figures copied to the hosts as metrics

    @property
    def exit_code(self) -> ExitCode:
        """The first step that did not succeed decides: apply, reboot, verify, smoke, its metrics."""
        steps = (self.run, self.rebooted, self.verified, self.smoked, self.published)
        return first_failure(s.exit_code if s is not None else None for s in steps)

    def to_dict(self) -> dict[str, Any]:
        out = self.run.to_dict()
        out["plan"] = {h: f.get(PLAN_FACT) for h, f in self.run.facts.items()}
        out["reboot"] = self.decision.to_dict()
        out["rebooted"] = self.rebooted.to_dict() if self.rebooted else None
        out["verify"] = self.verified.to_dict() if self.verified else None
        out["smoke"] = self.smoked.to_dict() if self.smoked else None
        out["exit_code"] = int(self.exit_code)
        return out


def up(
    inventory: Path | None,
    *,
    limit: str | None = None,
    tags: Sequence[str] = (),
    skip_tags: Sequence[str] = (),
    check: bool = False,
    extravars: dict[str, Any] | None = None,
    reboot: bool = False,
    verify_after: bool = True,
    smoke_after: bool = True,
    verbosity: int = 0,
    accept_new_host_keys: bool = False,
    on_progress: ProgressCallback | None = None,
    batch: str | None = None,
    max_fail: str | None = None,
) -> Result[UpOutcome]:
    """Apply site.yml; then, each only while every step before it succeeded: reboot the hosts
    that need it (when allowed), verify the roles that ran, and (a full run: no tags) smoke-test.
    `batch` (N hosts or P% of them) rolls site.yml's role plays over the fleet batch by batch;
    `max_fail` (P%) stops the roll when more than that share of a batch failed."""
    rolling = engine.parse_batch(batch) if batch is not None else None
    threshold = engine.parse_max_fail(max_fail) if max_fail is not None else None
    inv = engine.resolve_inventory(inventory)
    # What the run applies, recorded on each host for verify, smoke and undo: the -e options of
    # the plan, of every role the tags select and of the smoke test when it ends the run.
    smokes = smoke_after and not tags and not skip_tags
    applied = ("plan", *roles_for_tags(tags, skip_tags), *(("smoke",) if smokes else ()))
    recorded = {APPLIED_OPTIONS_VAR: applied_options(extravars, applied)}
    # How both runs on the hosts reach them, site.yml's and the smoke test's at the end.
    reach: dict[str, Any] = {"limit": limit, "accept_new_host_keys": accept_new_host_keys, "on_progress": on_progress}
    run = engine.run_playbook(
        "site.yml",
        inv,
        batch=rolling,
        max_fail=threshold,
        tags=tags,
        skip_tags=skip_tags,
        check=check,
        extravars={**(extravars or {}), **recorded},
        verbosity=verbosity,
        **reach,
    )
    outcome = UpOutcome(run, decide(run.facts, run.hostvars, allow_reboot=reboot and not check))
    errors = list(run.errors)
    published: tuple[str, ...] = ()
    if run.exit_code == ExitCode.OK:
        outcome.rebooted = reboot_hosts(outcome.decision, inv, accept_new_host_keys=accept_new_host_keys)
        errors += outcome.rebooted.errors if outcome.rebooted else []
    if verify_after and not check and outcome.exit_code == ExitCode.OK:
        outcome.verified = run_checks(inv, limit=limit, roles=roles_for_tags(tags, skip_tags), extravars=extravars)
    if smokes and not check and outcome.exit_code == ExitCode.OK:
        outcome.smoked = measure(inv, extravars=extravars, **reach)
        errors += outcome.smoked.run.errors
        outcome.published, published = publish_metrics(inv, outcome.smoked.reports, accept_new_host_keys=accept_new_host_keys)
        errors += outcome.published.errors if outcome.published else []
    warnings = [f"warning: {w}" for w in run.warnings]
    messages = (*warnings, *reboot_messages(outcome.decision, allowed=reboot and not check), *published)
    return Result("up", outcome, outcome.exit_code, messages, tuple(errors))


def reboot_hosts(decision: RebootDecision, inventory: Path, *, accept_new_host_keys: bool = False) -> RunResult | None:
    """Reboot the hosts the decision names, once each, and wait for them (reboot.yml); None when there are none."""
    if not decision.reboot:
        return None
    return engine.run_playbook(
        "reboot.yml", inventory, limit=",".join(decision.reboot), accept_new_host_keys=accept_new_host_keys
    )


def reboot_messages(decision: RebootDecision, allowed: bool, again: str = "run again with --reboot") -> tuple[str, ...]:
    """A line per host rebooted and per reboot left pending (with how to do it: AGAIN when not allowed)."""
    done = [f"rebooted {host}: " + "; ".join(reasons) for host, reasons in decision.reboot.items()]
    how = "reboot it yourself (this machine is never rebooted)" if allowed else again
    pending = [f"reboot pending on {host}: " + "; ".join(reasons) + f"; {how}" for host, reasons in decision.pending.items()]
    return (*done, *pending)


# ---------------------------------------------------------------- undo


@dataclass
class UndoOutcome:
    """The steps of `provisioner undo`: the restore, then the reboot of the hosts whose restore needs one."""

    run: RunResult  # undo.yml
    decision: RebootDecision
    rebooted: RunResult | None = None

    @property
    def exit_code(self) -> ExitCode:
        return first_failure(s.exit_code if s is not None else None for s in (self.run, self.rebooted))

    def to_dict(self) -> dict[str, Any]:
        out = self.run.to_dict()
        out["reboot"] = self.decision.to_dict()
        out["rebooted"] = self.rebooted.to_dict() if self.rebooted else None
        out["exit_code"] = int(self.exit_code)
        return out


def undo_roles() -> tuple[str, ...]:
    """The roles playbooks/undo.yml undoes, in its order."""
    plays = yaml.safe_load((paths.PLAYBOOKS / "undo.yml").read_text()) or []
    names = [t["ansible.builtin.include_role"]["name"] for play in plays for t in play.get("tasks", [])]
    return tuple(dict.fromkeys(names))


def undo(
    inventory: Path | None,
    *,
    reboot: bool = False,
    check: bool = False,
    accept_new_host_keys: bool = False,
    tags: Sequence[str] = (),
    skip_tags: Sequence[str] = (),
    **run_options: Any,
) -> Result[UndoOutcome]:
    """Restore what the tuning changed, from the originals each host recorded (undo.yml); then,
    when allowed and the restore succeeded, reboot the hosts whose restore needs it (1 GiB pages
    taken off the kernel command line stay reserved until then), once each, never this machine.
    --tags/--skip-tags select roles as up's do (a phase tag selects its role: the undo of a role is
    whole). `run_options` are engine.run_playbook's (limit, on_progress)."""
    engine.check_tags(tags, skip_tags)
    selected: tuple[str, ...] = ()
    if tags or skip_tags:
        selected = roles_for_tags(tags, skip_tags, roles=undo_roles())
        if not selected:
            raise BadInput("--tags/--skip-tags leave no role to undo: name a role (e.g. --tags hugepages) or drop them")
    inv = engine.resolve_inventory(inventory)
    run = engine.run_playbook(
        "undo.yml", inv, check=check, accept_new_host_keys=accept_new_host_keys, tags=selected, **run_options
    )
    outcome = UndoOutcome(run, decide(run.facts, run.hostvars, allow_reboot=reboot and not check))
    errors = list(run.errors)
    if run.exit_code == ExitCode.OK:
        outcome.rebooted = reboot_hosts(outcome.decision, inv, accept_new_host_keys=accept_new_host_keys)
        errors += outcome.rebooted.errors if outcome.rebooted else []
    messages = reboot_messages(
        outcome.decision, allowed=reboot and not check, again="run provisioner undo --reboot (or reboot it)"
    )
    return Result("undo", outcome, outcome.exit_code, messages, tuple(errors))


# ---------------------------------------------------------------- verify


def verify(
    inventory: Path | None, *, limit: str | None = None, tags: Sequence[str] = (), skip_tags: Sequence[str] = ()
) -> Result[VerifyResult]:
    """The testinfra checks of every role site.yml applies (those --tags/--skip-tags select, as up
    applies them); no check at all is bad input (a wrong host pattern)."""
    engine.check_tags(tags, skip_tags)
    roles = roles_for_tags(tags, skip_tags)
    if (tags or skip_tags) and not roles:
        raise BadInput("--tags/--skip-tags leave no role to check: name a role (e.g. --tags storage) or drop them")
    inv = engine.resolve_inventory(inventory)
    engine.check_limit(inv, limit)  # here, not as "no checks ran" after reaching the hosts
    result = run_checks(inv, limit=limit, roles=roles)
    if not result.checks:
        return Result("verify", result, ExitCode.BAD_INPUT, errors=("no checks ran: is the inventory's host pattern right?",))
    return Result("verify", result, result.exit_code)


# ---------------------------------------------------------------- status

STATUS_FACT = "provisioner_status"
DRIFTED, OK, NOT_APPLICABLE = "drifted", "ok", "not applicable"
# Failures first: what drifted, then what holds, then what does not apply to the host.
_STATE_ORDER = {DRIFTED: 0, OK: 1, NOT_APPLICABLE: 2}


@dataclass
class HostStatus:
    """One host's managed settings, each the role's expected value against the live one."""

    host: str
    settings: list[dict[str, Any]]
    seconds: float | None = None

    @classmethod
    def from_fact(cls, host: str, fact: dict[str, Any]) -> HostStatus:
        settings = sorted(fact.get("settings") or [], key=lambda s: _STATE_ORDER.get(s.get("state", ""), 1))
        return cls(host, settings, fact.get("seconds"))

    @property
    def drifted(self) -> list[dict[str, Any]]:
        return [s for s in self.settings if s.get("state") == DRIFTED]

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "seconds": self.seconds, "drifted": len(self.drifted), "settings": self.settings}


@dataclass
class StatusRun:
    """The read-only status playbook's run and every host's settings it could read."""

    run: RunResult
    hosts: dict[str, HostStatus]

    @property
    def exit_code(self) -> ExitCode:
        """The run's own failure first (3 unreachable, 2 never provisioned), else 1 when anything drifted."""
        drifted = any(h.drifted for h in self.hosts.values())
        return first_failure((self.run.exit_code, ExitCode.HOST_FAILED if drifted else ExitCode.OK))

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_code": int(self.exit_code),
            "run": self.run.to_dict(),
            "hosts": {name: h.to_dict() for name, h in self.hosts.items()},
        }


def status(inventory: Path | None, **run_options: Any) -> Result[StatusRun]:
    """Every setting the roles manage, expected against live, per host (playbooks/status.yml,
    changes nothing); `run_options` are engine.run_playbook's (limit, accept_new_host_keys, on_progress)."""
    run = engine.run_playbook("status.yml", engine.resolve_inventory(inventory), **run_options)
    hosts = {h: HostStatus.from_fact(h, f[STATUS_FACT]) for h, f in sorted(run.facts.items()) if f.get(STATUS_FACT)}
    outcome = StatusRun(run, hosts)
    return Result("status", outcome, outcome.exit_code, repair_messages(hosts.values()), tuple(run.errors))


def repair_messages(hosts: Iterable[HostStatus]) -> tuple[str, ...]:
    """For each host that drifted: how many settings, and the run that puts them back; a
    setting whose value a file of someone else's sets (the script's "repair") is named with
    that file instead, since `provisioner up` rewrites only its own files."""
    out = []
    for h in hosts:
        if not h.drifted:
            continue
        foreign = [s for s in h.drifted if s.get("repair")]
        ours = [s for s in h.drifted if not s.get("repair")]
        if ours:
            roles = ",".join(sorted({str(s.get("role")) for s in ours}))
            out.append(f"{h.host}: {len(ours)} setting(s) drifted; repair with: provisioner up --limit {h.host} --tags {roles}")
        out += [f"{h.host}: {s.get('name')} is {s['repair']}" for s in foreign]
    return tuple(out)


# ---------------------------------------------------------------- smoke


def measure(
    inventory: Path,
    *,
    limit: str | None = None,
    profile: str = "quick",
    baseline: bool = False,
    extravars: dict[str, Any] | None = None,
    accept_new_host_keys: bool = False,
    on_progress: ProgressCallback | None = None,
    html: Path | None = None,
    config_only: bool = False,
) -> SmokeRun:
    """Run playbooks/smoke.yml, judge every host's figures, keep them, write the HTML report.

    `config_only` runs no workload, only the configuration checks: nothing is kept (the last
    run with figures stays the one the next is compared with) and the HTML report is written
    only where `html` asks for it."""
    from . import report, smoke

    if config_only and baseline:
        raise BadInput("--config-only checks the tuned configuration and a --baseline run has none: drop one of them")
    if config_only and (extravars or {}).get("smoke_cluster"):
        raise BadInput("--config-only runs no workload and --cluster is one: drop one of them")
    if config_only and profile != "quick":
        raise BadInput("--config-only runs no workload, so --full sizes nothing: drop one of them")
    extra = {**(extravars or {}), "smoke_profile": profile, "smoke_mode": "baseline" if baseline else "tuned"}
    if config_only:
        extra["smoke_config_only"] = True
    run = engine.run_playbook(
        "smoke.yml", inventory, limit=limit, extravars=extra, accept_new_host_keys=accept_new_host_keys, on_progress=on_progress
    )
    reports = [
        smoke.judge(host, f["smoke_result"], keep=not config_only)
        for host, f in sorted(run.facts.items())
        if f.get("smoke_result")
    ]
    wanted = html or (None if config_only else smoke.default_html())
    out = report.write_html(reports, wanted) if reports and wanted else None
    return SmokeRun(run, reports, out)


def cluster_members(inventory: Path, limit: str | None, extravars: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The hosts `smoke --cluster` runs on: the Ray cluster's members within --limit (role ray's
    groups, ray_head_group and ray_worker_group as -e gives them, else ray_head and ray_workers),
    and the hosts it leaves out, in neither group. Refused when no member is the head."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    manager = InventoryManager(loader=DataLoader(), sources=[str(inventory)])
    if limit:
        manager.subset(limit)
    reached = [h.name for h in manager.get_hosts("all")]
    head_group = str(extravars.get("ray_head_group") or "ray_head")
    worker_group = str(extravars.get("ray_worker_group") or "ray_workers")

    def group(name: str) -> set[str]:
        found = manager.groups.get(name)
        return {h.name for h in found.get_hosts()} if found else set()

    heads, workers = group(head_group), group(worker_group)
    if reached and not heads & set(reached):
        raise BadInput(
            f"smoke --cluster measures the Ray cluster from its head: no host of group {head_group} is in the run"
            f"{' (--limit ' + limit + ')' if limit else ''}; put the head (role ray) in the inventory or the limit"
        )
    members = [h for h in reached if h in heads | workers]
    return members, [h for h in reached if h not in members]


def smoke(inventory: Path | None, **kwargs: Any) -> Result[SmokeRun]:
    """Measure the ML workloads on each host against the hardware's limits (see `measure`),
    then publish the tuned figures as metrics (see `publish_metrics`). With --cluster, on the
    Ray cluster's members only (see `cluster_members`), saying which hosts were left out."""
    inv = engine.resolve_inventory(inventory)
    left_out: tuple[str, ...] = ()
    extravars = kwargs.get("extravars") or {}
    if extravars.get("smoke_cluster") and not kwargs.get("config_only"):
        members, others = cluster_members(inv, kwargs.get("limit"), extravars)
        if others:
            kwargs["limit"] = ",".join(members)
            groups = f"{extravars.get('ray_head_group') or 'ray_head'} nor {extravars.get('ray_worker_group') or 'ray_workers'}"
            left_out = (f"smoke --cluster left out {', '.join(others)}: in neither {groups}, not a member of the Ray cluster",)
    result = measure(inv, **kwargs)
    # The configuration checks alone have no figures: the metrics of the last measured run stay.
    published, notes = (
        (None, ())
        if kwargs.get("config_only")
        else publish_metrics(inv, result.reports, accept_new_host_keys=kwargs.get("accept_new_host_keys", False))
    )
    messages = left_out + ((f"report: {result.html}",) if result.html else ()) + notes
    errors = (*result.run.errors, *(published.errors if published else ()))
    code = first_failure((result.exit_code, published.exit_code if published else None))
    return Result("smoke", result, code, messages, errors)


def publish_metrics(
    inventory: Path, reports: Sequence[Any], *, accept_new_host_keys: bool = False
) -> tuple[RunResult | None, tuple[str, ...]]:
    """Render each tuned host's judged figures as textfile metrics, keep them beside its smoke
    history and copy them into the host's textfile directory where role monitoring made one
    (playbooks/smoke_metrics.yml). A baseline is the machine before tuning: never published.
    Returns that run (None when nothing was published) and one note per host: where they went."""
    from . import metrics

    files = {r.host: str(metrics.write_smoke(r)) for r in reports if r.mode == "tuned"}
    if not files:
        return None, ()
    run = engine.run_playbook(
        "smoke_metrics.yml",
        inventory,
        limit=",".join(files),
        extravars={"smoke_metrics_files": files},
        accept_new_host_keys=accept_new_host_keys,
    )
    notes = []
    for host, kept in files.items():
        remote = run.facts.get(host, {}).get("smoke_metrics_published")
        where = (
            f"{host}:{remote} (node_exporter's textfile collector)"
            if remote
            else "no textfile directory on the host (role monitoring)"
        )
        notes.append(f"smoke metrics of {host}: {where}; kept in {kept}")
    return run, tuple(notes)


# ---------------------------------------------------------------- bundle


@dataclass
class LockUpdate:
    """A lock file resolved again: where, and how many pins each component has."""

    path: Path
    components: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "components": self.components}


def bundle(
    dest: Path | None,
    components: Sequence[str],
    *,
    update_lock: bool = False,
    upgrade: bool = False,
    lock: Path | None = None,
    python_version: str | None = None,
    glibc: str | None = None,
    index_url: str | None = None,
    extra_index_urls: Sequence[str] = (),
    torch_index_url: str | None = None,
) -> Result[Any]:
    """Build a wheelhouse of the lock's pins for some components (the default: role mlstack's, bundle.DEFAULT_COMPONENTS),
    or, with `update_lock`, resolve the lock's requirements again and rewrite the lock file."""
    from . import bundle as bundles

    indexes: dict[str, Any] = {"index_url": index_url, "extra_index_urls": extra_index_urls, "torch_index_url": torch_index_url}
    python = python_version or bundles.DEFAULT_PYTHON
    if update_lock:
        path = lock or bundles.DEFAULT_LOCK
        resolved = bundles.generate_lock(
            path, python_version=python, glibc=glibc or bundles.DEFAULT_GLIBC, upgrade=upgrade, **indexes
        )
        counts = {c: len(p) for c, p in resolved.components.items()}
        return Result("bundle", LockUpdate(path, counts), messages=("rebuild the wheelhouses from it: provisioner bundle",))
    built = bundles.build_wheelhouse(
        dest or bundles.default_wheelhouse(),
        list(components) or list(bundles.DEFAULT_COMPONENTS),
        lock_path=lock or bundles.DEFAULT_LOCK,
        python_version=python,
        platforms=bundles.manylinux_platforms(glibc) if glibc else None,
        **indexes,
    )
    return Result("bundle", built, messages=(f"install offline with: provisioner up -e mlstack_wheelhouse={built.path}",))


# ---------------------------------------------------------------- serving

SERVING_FACT = "provisioner_serving"
SERVING_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass
class ServeStatus:
    """Each host's model-server workers, as playbooks/serve_status.yml read them."""

    run: RunResult
    hosts: dict[str, dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run.to_dict(), "hosts": self.hosts}


def serve_status(inventory: Path | None, **run_options: Any) -> Result[ServeStatus]:
    """Per host: worker units, CPU slices, threads, loaded versions, cache and requests/s
    (read-only); a worker that does not answer or is not active makes the exit code 1."""
    run = engine.run_playbook("serve_status.yml", engine.resolve_inventory(inventory), **run_options)
    hosts = {h: f[SERVING_FACT] for h, f in sorted(run.facts.items()) if f.get(SERVING_FACT)}
    down = [
        f"{host}: worker {w['index']} is {w.get('active')}"
        + ("" if w.get("answering") else f", not answering ({w.get('error')})")
        for host, data in hosts.items()
        for w in data.get("workers", [])
        if w.get("active") != "active" or not w.get("answering") or not w.get("ready")
    ]
    code = first_failure((run.exit_code, ExitCode.HOST_FAILED if down else ExitCode.OK))
    return Result("serve status", ServeStatus(run, hosts), code, tuple(down), tuple(run.errors))


def parse_model_version(value: str) -> tuple[str, str]:
    """'NAME/VERSION' -> (name, version); refused (exit 2) unless both are registry names."""
    name, _, version = value.partition("/")
    if not (SERVING_NAME.match(name) and SERVING_NAME.match(version)):
        raise BadInput(f"model {value!r} is not NAME/VERSION: both parts 1-64 letters, digits, '.', '_' or '-' (e.g. fraud/7)")
    return name, version


def check_model_dir(source: Path) -> dict[str, Any]:
    """A model version directory on the control node: metadata.json naming a file that exists."""
    meta_path = source / "metadata.json"
    if not source.is_dir():
        raise BadInput(f"--from {source}: no such directory; give the directory holding metadata.json and the model file")
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise BadInput(f"--from {source}: no metadata.json there (framework, file, features)") from None
    except ValueError as exc:
        raise BadInput(f"{meta_path}: not JSON ({exc})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("file"), str) or not isinstance(meta.get("features"), list):
        raise BadInput(f"{meta_path}: needs 'framework', 'file' and 'features' (a list of names)")
    if not (source / meta["file"]).is_file():
        raise BadInput(f"{meta_path} names the model file {meta['file']!r}, which is not in {source}")
    return meta


def serve_load(inventory: Path | None, model: str, source: Path, **run_options: Any) -> Result[RunResult]:
    """Add NAME/VERSION from a directory on the control node to every host's registry and roll
    it in worker by worker (playbooks/serve_load.yml): each worker restarts only when the one
    before it is ready again, so requests keep being answered. A version the server's own
    check refuses (corrupt file, over the memory budget) is removed again and nothing restarts."""
    name, version = parse_model_version(model)
    check_model_dir(source)
    run = engine.run_playbook(
        "serve_load.yml",
        engine.resolve_inventory(inventory),
        extravars={"serving_load_name": name, "serving_load_version": version, "serving_load_src": str(source.resolve())},
        **run_options,
    )
    return Result("serve load", run, run.exit_code, (), tuple(run.errors))


# ---------------------------------------------------------------- ML environment generations

GENERATION_NAME = re.compile(r"^[0-9a-f]{6,64}$")


def rollback(inventory: Path | None, to: str | None = None, **run_options: Any) -> Result[RunResult]:
    """Point every host's ML environment back at its previous generation, or at TO
    (playbooks/rollback.yml), and restart the services that ran from the one it leaves. Every
    host is checked first: one without that generation stops the run before any host switches."""
    if to is not None and not GENERATION_NAME.match(to):
        raise BadInput(
            f"--to {to!r} is not a generation's name: pass one that provisioner status lists"
            " (hex digits, e.g. 3f2a9c1d0b7e), or leave --to out for the previous one"
        )
    run = engine.run_playbook(
        "rollback.yml",
        engine.resolve_inventory(inventory),
        extravars={"mlstack_rollback_to": to} if to else None,
        **run_options,
    )
    return Result("rollback", run, run.exit_code, (), tuple(run.errors))


# ---------------------------------------------------------------- lab servers


def lab_up(name: str, devices: Sequence[str] = (), fresh: bool = False, cpu_weight: int | None = None) -> Result[Any]:
    from . import lab

    return Result("lab up", lab.up(name, devices=list(devices), fresh=fresh, cpu_weight=cpu_weight))


def lab_down(name: str) -> Result[dict[str, Any]]:
    from . import lab

    removed = lab.down(name)
    return Result("lab down", {"name": name, "removed": removed})


def lab_list() -> Result[list[Any]]:
    from . import lab

    return Result("lab list", lab.list_servers())


# ---------------------------------------------------------------- tune


@dataclass
class TuneOutcome:
    """provisioner tune: the proposal (one row per host and knob), the hardware classes, the files written."""

    run: RunResult | None
    rows: list[Any]
    classes: dict[str, list[str]]
    written: list[Path]
    results: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "rows": [{**asdict(r), "kept": r.kept} for r in self.rows],
            "classes": self.classes,
            "written": [str(p) for p in self.written],
            "results": self.results,
        }


def tune(
    inventory: Path | None,
    *,
    workloads: Sequence[str] = (),
    knobs: Sequence[str] = (),
    budget: str = "10m",
    write: bool = False,
    force: bool = False,
    html: Path | None = None,
    limit: str | None = None,
    accept_new_host_keys: bool = False,
    on_progress: ProgressCallback | None = None,
) -> Result[TuneOutcome]:
    """Measure each knob's candidates against the plan's rule on one host per hardware class
    (playbooks/tune.yml), print the proposal and, with `write`, put the kept values into the
    inventory as the plan's overrides (provisioner.tune.proposal)."""
    from .tune import classes, proposal

    chosen = proposal.check_workloads(workloads)
    wanted = proposal.check_knobs(knobs, chosen)
    seconds = proposal.parse_budget(budget)
    inv = engine.resolve_inventory(inventory)
    engine.check_limit(inv, limit)
    reached = engine.fleet_hosts(inv, limit)
    if write:
        proposal.check_writable(inv, reached)
    found = read_fact("tune", HARDWARE_FACT, inv, limit=limit, accept_new_host_keys=accept_new_host_keys)
    hardware = found.value.by_host()
    if found.exit_code != ExitCode.OK:
        return Result("tune", TuneOutcome(found.value.run, [], {}, [], {}), found.exit_code, errors=found.errors)
    groups = classes.of(hardware)
    if write:
        proposal.check_class_writable(inv, groups)
    measured = [members[0] for members in groups.values()]
    run = engine.run_playbook(
        "tune.yml",
        inv,
        limit=",".join(measured),
        extravars={"tune_workloads": chosen, "tune_knobs": wanted, "tune_budget_s": seconds, "tune_force": force},
        accept_new_host_keys=accept_new_host_keys,
        on_progress=on_progress,
    )
    results = {h: f["smoke_tune_result"] for h, f in run.facts.items() if f.get("smoke_tune_result")}
    rows: list[Any] = []
    written: list[Path] = []
    messages: list[str] = []
    placement = {host: classes.class_group(print_) for print_, members in groups.items() for host in members}
    for print_, members in groups.items():
        result = results.get(members[0])
        if result is None:
            continue
        # What a kernel knob changed and put back, and what a run that never ended had left (its journal).
        messages += [f"{members[0]}: {said}" for said in result.get("restored", []) + result.get("put_back", [])]
        if result.get("refused"):
            messages.append(f"{members[0]}: {result['refused']}")
            continue
        for host in members:
            rows += proposal.rows(host, result, measured_on=members[0])
        if write and len(members) == 1:
            path = proposal.write(inv, members[0], [r for r in proposal.rows(members[0], result) if r.kept])
            written += [path] if path else []
        elif write:  # the class's values once, in its group (the evidence names the host measured)
            paths_, said = proposal.write_class(
                inv, print_, proposal.rows(members[0], result, measured_on=members[0]), members, placement=placement
            )
            written += paths_
            messages += said
        if len(members) > 1:
            messages.append(f"{', '.join(members[1:])}: same hardware as {members[0]}, which was measured for them")
    if write:  # a reached host leaves a class's group its hardware no longer matches
        messages += proposal.prune(inv, placement)
    outcome = TuneOutcome(run, rows, groups, written, results)
    if results:
        from . import report

        messages.append(f"report: {report.write_tune_html(outcome, html or paths.state_dir() / 'tune' / 'report.html')}")
    if write and written:
        messages.append(f"written: {', '.join(map(str, written))}; apply with: provisioner up")
    elif rows and not write:
        messages.append("nothing written: rerun with --write to put the kept values into the inventory")
    # A host refused as busy measured nothing: the run did not do what was asked.
    refused = any(r.get("refused") for r in results.values())
    code = run.exit_code if run.exit_code != ExitCode.OK else (ExitCode.HOST_FAILED if refused else ExitCode.OK)
    return Result("tune", outcome, code, tuple(messages), tuple(run.errors))
