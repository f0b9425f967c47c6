"""What each command does, outside the command line: run its steps, decide its exit code.

Every function returns a `Result` (provisioner.result); the typer commands in cli.py only
parse the options, call one of these and print what it returns. Errors that stop a command
before it has anything to show (bad input, a problem on the control node) are raised as
`ProvisionerError`s and leave by the CLI's one abort path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import engine
from .errors import ExitCode
from .reboot import RebootDecision, decide
from .result import Result, first_failure
from .runs import ProgressCallback, RunResult
from .smoke import SmokeRun
from .verify import VerifyResult, roles_for_tags
from .verify import verify as run_checks

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

    @property
    def exit_code(self) -> ExitCode:
        """The first step that did not succeed decides: apply, reboot, verify, smoke."""
        steps = (self.run, self.rebooted, self.verified, self.smoked)
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
) -> Result[UpOutcome]:
    """Apply site.yml; then, each only while every step before it succeeded: reboot the hosts
    that need it (when allowed), verify the roles that ran, and (a full run: no tags) smoke-test."""
    inv = engine.resolve_inventory(inventory)
    run = engine.run_playbook(
        "site.yml",
        inv,
        limit=limit,
        tags=tags,
        skip_tags=skip_tags,
        check=check,
        extravars=extravars,
        verbosity=verbosity,
        accept_new_host_keys=accept_new_host_keys,
        on_progress=on_progress,
    )
    outcome = UpOutcome(run, decide(run.facts, run.hostvars, allow_reboot=reboot and not check))
    errors = list(run.errors)
    if outcome.decision.reboot and run.exit_code == ExitCode.OK:
        outcome.rebooted = engine.run_playbook(
            "reboot.yml", inv, limit=",".join(outcome.decision.reboot), accept_new_host_keys=accept_new_host_keys
        )
        errors += outcome.rebooted.errors
    if verify_after and not check and outcome.exit_code == ExitCode.OK:
        outcome.verified = run_checks(inv, limit=limit, roles=roles_for_tags(tags, skip_tags))
    if smoke_after and not check and not tags and not skip_tags and outcome.exit_code == ExitCode.OK:
        outcome.smoked = measure(
            inv, limit=limit, extravars=extravars, accept_new_host_keys=accept_new_host_keys, on_progress=on_progress
        )
        errors += outcome.smoked.run.errors
    return Result("up", outcome, outcome.exit_code, reboot_messages(outcome.decision, allowed=reboot), tuple(errors))


def reboot_messages(decision: RebootDecision, allowed: bool) -> tuple[str, ...]:
    done = [f"rebooted {host}: " + "; ".join(reasons) for host, reasons in decision.reboot.items()]
    how = "reboot it yourself (this machine is never rebooted)" if allowed else "run again with --reboot"
    pending = [f"reboot pending on {host}: " + "; ".join(reasons) + f"; {how}" for host, reasons in decision.pending.items()]
    return (*done, *pending)


# ---------------------------------------------------------------- undo


def undo(inventory: Path | None, **run_options: Any) -> Result[RunResult]:
    """Restore what the tuning changed, from the originals each host recorded (undo.yml);
    `run_options` are engine.run_playbook's (limit, check, accept_new_host_keys, on_progress)."""
    run = engine.run_playbook("undo.yml", engine.resolve_inventory(inventory), **run_options)
    return Result("undo", run, run.exit_code, errors=tuple(run.errors))


# ---------------------------------------------------------------- verify


def verify(inventory: Path | None, *, limit: str | None = None) -> Result[VerifyResult]:
    """The testinfra checks of every role site.yml applies; no check at all is bad input (a wrong host pattern)."""
    result = run_checks(engine.resolve_inventory(inventory), limit=limit)
    if not result.checks:
        return Result("verify", result, ExitCode.BAD_INPUT, errors=("no checks ran: is the inventory's host pattern right?",))
    return Result("verify", result, result.exit_code)


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
) -> SmokeRun:
    """Run playbooks/smoke.yml, judge every host's figures, keep them, write the HTML report."""
    from . import report, smoke

    extra = {**(extravars or {}), "smoke_profile": profile, "smoke_mode": "baseline" if baseline else "tuned"}
    run = engine.run_playbook(
        "smoke.yml", inventory, limit=limit, extravars=extra, accept_new_host_keys=accept_new_host_keys, on_progress=on_progress
    )
    reports = [smoke.judge(host, f["smoke_result"]) for host, f in sorted(run.facts.items()) if f.get("smoke_result")]
    out = report.write_html(reports, html or smoke.default_html()) if reports else None
    return SmokeRun(run, reports, out)


def smoke(inventory: Path | None, **kwargs: Any) -> Result[SmokeRun]:
    """Measure the ML workloads on each host against the hardware's limits (see `measure`)."""
    result = measure(engine.resolve_inventory(inventory), **kwargs)
    messages = (f"report: {result.html}",) if result.html else ()
    return Result("smoke", result, result.exit_code, messages, tuple(result.run.errors))


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
    lock: Path | None = None,
    python_version: str | None = None,
    glibc: str | None = None,
    index_url: str | None = None,
    extra_index_urls: Sequence[str] = (),
    torch_index_url: str | None = None,
) -> Result[Any]:
    """Build a wheelhouse of the lock's pins for some components (the default: core and gbdt),
    or, with `update_lock`, resolve the lock's requirements again and rewrite the lock file."""
    from . import bundle as bundles

    indexes: dict[str, Any] = {"index_url": index_url, "extra_index_urls": extra_index_urls, "torch_index_url": torch_index_url}
    python = python_version or bundles.DEFAULT_PYTHON
    if update_lock:
        path = lock or bundles.DEFAULT_LOCK
        resolved = bundles.generate_lock(path, python_version=python, glibc=glibc or bundles.DEFAULT_GLIBC, **indexes)
        counts = {c: len(p) for c, p in resolved.components.items()}
        return Result("bundle", LockUpdate(path, counts), messages=("rebuild the wheelhouses from it: provisioner bundle",))
    built = bundles.build_wheelhouse(
        dest or bundles.default_wheelhouse(),
        list(components) or ["core", "gbdt"],
        lock_path=lock or bundles.DEFAULT_LOCK,
        python_version=python,
        platforms=bundles.manylinux_platforms(glibc) if glibc else None,
        **indexes,
    )
    return Result("bundle", built, messages=(f"install offline with: provisioner up -e mlstack_wheelhouse={built.path}",))


# ---------------------------------------------------------------- lab servers


def lab_up(name: str, devices: Sequence[str] = ()) -> Result[Any]:
    from . import lab

    return Result("lab up", lab.up(name, devices=list(devices)))


def lab_down(name: str) -> Result[dict[str, Any]]:
    from . import lab

    removed = lab.down(name)
    return Result("lab down", {"name": name, "removed": removed})


def lab_list() -> Result[list[Any]]:
    from . import lab

    return Result("lab list", lab.list_servers())
