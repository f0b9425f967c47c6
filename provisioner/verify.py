"""Runs the testinfra checks against an inventory and collects per-host results.

Each role's checks live in checks/test_<role>.py; `summarize` folds them into one line per
host and role (passed, skipped: not configured, or failed with each failure's reason).
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import engine, options, paths
from .errors import ExitCode

CHECKS = Path(__file__).resolve().parent / "checks"


@dataclass
class CheckResult:
    host: str
    check: str
    outcome: str  # passed / failed / skipped
    message: str = ""
    role: str = ""  # the role whose promise the check holds (its file: checks/test_<role>.py)


@dataclass(frozen=True)
class RoleSummary:
    """A role's checks on one host in one line: passed, skipped (nothing configured) or failed."""

    host: str
    role: str
    outcome: str  # passed / skipped / failed
    checks: tuple[CheckResult, ...]

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.outcome == "failed")

    @property
    def details(self) -> tuple[str, ...]:
        """Why: each failed check with its reason in full, else one line (why nothing ran, or what passed)."""
        if self.outcome == "failed":
            return tuple(f"{c.check}: {c.message}" if c.message else c.check for c in self.failures)
        if self.outcome == "skipped":
            reasons = list(dict.fromkeys(c.message for c in self.checks if c.message))
            return ("not configured" + (f" ({reasons[0]})" if len(reasons) == 1 else ""),)
        passed = sum(c.outcome == "passed" for c in self.checks)
        skipped = len(self.checks) - passed
        return (f"{passed} check{'s' if passed != 1 else ''}" + (f", {skipped} skipped" if skipped else ""),)


def summarize(checks: list[CheckResult]) -> list[RoleSummary]:
    """One summary per host and role, in the order the checks ran."""
    groups: dict[tuple[str, str], list[CheckResult]] = {}
    for c in checks:
        groups.setdefault((c.host, c.role), []).append(c)
    out = []
    for (host, role), cs in groups.items():
        if any(c.outcome == "failed" for c in cs):
            outcome = "failed"
        elif all(c.outcome == "skipped" for c in cs):
            outcome = "skipped"
        else:
            outcome = "passed"
        out.append(RoleSummary(host, role, outcome, tuple(cs)))
    return out


@dataclass
class VerifyResult:
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.HOST_FAILED if any(c.outcome == "failed" for c in self.checks) else ExitCode.OK

    def by_host(self) -> dict[str, list[CheckResult]]:
        out: dict[str, list[CheckResult]] = {}
        for c in self.checks:
            out.setdefault(c.host, []).append(c)
        return out

    def summary(self) -> list[RoleSummary]:
        return summarize(self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_code": int(self.exit_code),
            "hosts": {
                h: [{"check": c.check, "role": c.role, "outcome": c.outcome, "message": c.message} for c in cs]
                for h, cs in self.by_host().items()
            },
            "roles": {
                h: {s.role: {"outcome": s.outcome, "details": list(s.details)} for s in self.summary() if s.host == h}
                for h in self.by_host()
            },
        }


class _Collector:
    """A pytest plugin that records each check's outcome under its host's name."""

    def __init__(self) -> None:
        self.results: list[CheckResult] = []
        self._names: dict[str, tuple[str, str, str]] = {}

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        for item in items:
            params = dict(getattr(getattr(item, "callspec", None), "params", {}))
            target = params.pop("_testinfra_host", None)
            host = target.backend.get_pytest_id().split("://", 1)[-1] if target else "?"
            suffix = "-".join(str(v) for v in params.values())
            role = Path(str(item.path)).stem.removeprefix("test_")
            self._names[item.nodeid] = (host, f"{item.originalname}[{suffix}]" if suffix else item.originalname, role)

    def pytest_runtest_logreport(self, report: Any) -> None:
        failed_setup = report.when == "setup" and report.outcome != "passed"
        if report.when != "call" and not failed_setup:
            return
        host, name, role = self._names.get(report.nodeid, ("?", report.nodeid, ""))
        message = ""
        if report.outcome == "failed":
            text = str(report.longrepr)
            errors = [ln[2:].strip() for ln in text.splitlines() if ln.startswith("E ")]
            message = errors[0] if errors else text.strip().splitlines()[-1]
        elif report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            message = str(report.longrepr[-1])
        self.results.append(CheckResult(host, name, report.outcome, message, role))


def site_roles() -> tuple[str, ...]:
    """The roles playbooks/site.yml applies, in order."""
    plays = yaml.safe_load((paths.PLAYBOOKS / "site.yml").read_text()) or []
    names = [r["role"] if isinstance(r, dict) else r for play in plays for r in play.get("roles", [])]
    return tuple(dict.fromkeys(names))


def roles_for_tags(
    tags: Sequence[str] = (), skip_tags: Sequence[str] = (), roles: Sequence[str] | None = None
) -> tuple[str, ...]:
    """The roles (of ROLES, else the site roles) a run with these tags applied (a role's tag or
    one of its phase tags)."""

    def tagged(role: str, selection: Sequence[str]) -> bool:
        return any(t == role or t.startswith(f"{role}_") for t in selection)

    roles = tuple(site_roles() if roles is None else roles)
    if tags and "all" not in tags:
        roles = tuple(r for r in roles if tagged(r, tags))
    return tuple(r for r in roles if not tagged(r, skip_tags))


# The extra variable `provisioner up` hands site.yml: the -e options of each role the run applies,
# which role common's options.yml keeps on the host (checks.OPTIONS_FILE) for the verbs after it.
APPLIED_OPTIONS_VAR = "provisioner_applied_options"


def applied_options(extravars: dict[str, Any] | None, roles: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The -e options of each of ROLES (the roles a run applies), by the role that documents them;
    a role given none gets {} (it ran with its defaults and the inventory's values, which replace
    what an earlier run recorded for it). An option of a role the run does not apply is left out:
    that role never saw it."""
    owner = options.known_options()
    out: dict[str, dict[str, Any]] = {role: {} for role in roles}
    for key, value in (extravars or {}).items():
        role = owner.get(key)
        if role in out:
            out[role][key] = value
    return out


def hostspecs(limit: str | None) -> str:
    """testinfra's --hosts for an Ansible limit: it splits its value at commas into host specs, so
    each part of a limit like `a,b` (or `a:b`, Ansible's other list separator) gets its own
    ansible:// spec; `ansible://a,b` would leave `b` to the local backend."""
    parts = [p.strip() for p in re.split(r"[,:]", limit or "") if p.strip()] or ["all"]
    return ",".join(f"ansible://{p}" for p in parts)


def verify(
    inventory: Path,
    *,
    limit: str | None = None,
    roles: tuple[str, ...] | None = None,
    extravars: dict[str, Any] | None = None,
) -> VerifyResult:
    """Run the checks of the given roles (default: those site.yml applies) on every host of the
    inventory; `extravars` are the run's -e options, which the checks read over the inventory's
    and over the options the host's last runs recorded (a standalone verify: those alone)."""
    import pytest

    from . import checks

    engine.inventory_hosts(inventory)  # a malformed inventory is refused first
    engine.ensure_tools_on_path()  # testinfra's ansible backend runs ansible-inventory
    files = [str(CHECKS / f"test_{r}.py") for r in roles or site_roles() if (CHECKS / f"test_{r}.py").exists()]
    collector = _Collector()
    args = [
        *files,
        f"--hosts={hostspecs(limit)}",
        f"--ansible-inventory={inventory}",
        "-p",
        "no:cacheprovider",
        "-q",
        "--rootdir",
        str(CHECKS),
        "-o",
        "python_files=test_*.py",
    ]
    sink = io.StringIO()
    checks.EXTRA_VARS.clear()
    checks.EXTRA_VARS.update(extravars or {})
    checks.RECORDED.clear()
    checks.STATUS.clear()
    try:
        with redirect_stdout(sink), redirect_stderr(sink), engine.shared_ssh_masters():
            pytest.main(args, plugins=[collector])
    finally:
        checks.EXTRA_VARS.clear()
        checks.RECORDED.clear()
        checks.STATUS.clear()
    return VerifyResult(collector.results)
