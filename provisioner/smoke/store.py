"""The smoke history per host under the state directory (save, latest), judging a host's raw
figures against its baseline and last run (judge), and a run's outcome (SmokeRun).

Runs on the control node.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import paths
from ..errors import ExitCode
from ..runs import RunResult
from .base import FAIL, HostReport
from .compare import attach_baseline, flag_regressions
from .judgement import evaluate


def history_dir(host: str) -> Path:
    return paths.state_dir() / "smoke" / host


def save(report: HostReport) -> Path:
    d = history_dir(report.host)
    d.mkdir(parents=True, exist_ok=True)
    stamp = report.started.replace(":", "").replace("-", "") or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = d / f"{stamp}-{report.mode}-{report.profile}.json"
    path.write_text(json.dumps(report.to_dict(raw=True), indent=1))
    return path


def latest(host: str, mode: str, profile: str | None = None) -> HostReport | None:
    """The host's last kept run of this mode and profile (None: any profile)."""
    files = sorted(history_dir(host).glob(f"*-{mode}-{profile or '*'}.json"))
    return HostReport.from_dict(json.loads(files[-1].read_text())) if files else None


def judge(host: str, raw: dict[str, Any], keep: bool = True) -> HostReport:
    """Evaluate a host's raw figures against its limits, its baseline and its last run; keep it."""
    report = evaluate(raw)
    report.host = host
    if report.mode == "tuned":  # the baseline of the same profile, else of any
        attach_baseline(report, latest(host, "baseline", report.profile) or latest(host, "baseline"))
    flag_regressions(report, latest(host, report.mode, report.profile))
    if keep:
        save(report)
    return report


# ---------------------------------------------------------------- a run's outcome


@dataclass
class SmokeRun:
    """The playbook run that measured, and each measured host's judged report."""

    run: RunResult
    reports: list[HostReport]
    html: Path | None = None

    @property
    def exit_code(self) -> ExitCode:
        """The run's failure, else 1 when a tuned host failed a check (a baseline records, never fails)."""
        if self.run.exit_code != ExitCode.OK:
            return self.run.exit_code
        failed = any(r.status == FAIL and r.mode == "tuned" for r in self.reports)
        return ExitCode.HOST_FAILED if failed else ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_code": int(self.exit_code),
            "run": self.run.to_dict(),
            "html": str(self.html) if self.html else None,
            "hosts": {r.host: r.to_dict() for r in self.reports},
        }


def default_html() -> Path:
    return paths.state_dir() / "smoke" / "report.html"
