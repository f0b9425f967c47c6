"""Output to a pipe or a CI log stays readable: no wrapping at 80 columns; diffs from plain data."""

from __future__ import annotations

import io
import re
from pathlib import Path

from provisioner import render
from provisioner.runs import Change, Diff, HostResult, RunResult
from provisioner.smoke import Check, HostReport

LONG_REASON = (
    "1 -> 16 cores: 5.2x (33% of linear); more threads barely help: oversubscription, a thread cap, or memory-bound "
    "(see the plan's threads_per_job)"
)


def report() -> HostReport:
    check = Check("gbdt.xgboost", "gradient boosting", "xgboost hist training", "warn", LONG_REASON, 12.5, "M row-trees/s", 38.0)
    hardware = {"cpu": "AMD EPYC 9354", "physical_cores": 16, "threads": 16}
    return HostReport("train-01", "tuned", "quick", "2026-12-01T10:00:00Z", 88.0, hardware, [check])


def test_a_pipe_gets_each_table_row_on_one_line(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()  # not a terminal
    monkeypatch.setattr(render, "console", render.make_console(file=out))
    render.smoke([report()])
    text = out.getvalue()
    assert any(LONG_REASON in line for line in text.splitlines()), text
    assert max(len(line) for line in text.splitlines()) > 80


def test_a_terminal_keeps_its_own_width(monkeypatch):
    out = io.StringIO()
    console = render.make_console(file=out, force_terminal=True, width=80)
    monkeypatch.setattr(render, "console", console)
    render.smoke([report()])
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())  # without the colour codes
    assert max(len(line) for line in plain.splitlines()) <= 80


def test_columns_wins_on_a_pipe(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert render.make_console(file=io.StringIO()).width == 100


def test_changes_show_before_and_after_as_a_diff(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(render, "console", render.make_console(file=out))
    diffs = [Diff("vm.swappiness = 60\n", "vm.swappiness = 10\n", "/etc/sysctl.d/90-ml.conf", "/etc/sysctl.d/90-ml.conf")]
    changes = [Change("web1", "Write the sysctl settings", diffs), Change("web1", "Install packages", [Diff(text="Installed: htop")])]
    run = RunResult("site.yml", True, 0, {"web1": HostResult("web1", changed=2)}, {}, changes, Path("/x"), 1.0)
    render.changes(run)
    text = out.getvalue()
    assert "would change web1: Write the sysctl settings" in text
    assert "-vm.swappiness = 60" in text and "+vm.swappiness = 10" in text
    assert "Installed: htop" in text


def test_a_run_without_workloads_says_it_checked_the_configuration_only(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(render, "console", render.make_console(file=out))
    measured = report()
    measured.workloads = {"gbdt": 12.0}
    render.smoke([measured, report()])  # the second as smoke --config-only reports it
    text = out.getvalue()
    assert "train-01: smoke quick (tuned)" in text and "train-01: smoke configuration only (tuned)" in text
    assert text.count("  peak: ") == 1  # the peak is a workload's limit: only the measured run shows it


def plan_text(monkeypatch, fixture: str) -> str:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from facts_fixtures import load

    from provisioner.plan import derive_plan

    out = io.StringIO()
    monkeypatch.setattr(render, "console", render.make_console(file=out, width=200))
    render.plan({fixture: derive_plan(load(fixture)).to_dict()})
    return out.getvalue()


def test_sizes_are_shown_as_people_read_them():
    assert render.human_bytes(20220856800) == "18.8 GiB"
    assert render.human_bytes(3840755982336) == "3.5 TiB"
    assert render.human_bytes(512 * 2**20) == "512.0 MiB"
    assert render.human_bytes(100) == "100 B"
    assert render.plan_value("feature_matrix_bytes", 20220856800) == "18.8 GiB"
    assert render.plan_value("threads_per_job", 16) == "16"
    assert render.plan_value("reboot_required_for", []) == "[]"


def test_the_plan_shows_sizes_and_the_storage_proposal_as_a_sentence_and_a_table(monkeypatch):
    text = plan_text(monkeypatch, "epyc_4545p")
    row = next(line for line in text.splitlines() if "feature_matrix_bytes" in line)
    assert "│ 150.6 GiB " in row and "161695386400" not in row, row  # 161695386400 bytes
    assert "{" not in text, "no raw JSON"
    assert (
        "storage: raid0 (mdadm, xfs, chunk 512 KiB) of 2 drives at /data, 7.0 TiB usable; a proposal only: nothing is built "
        "until -e storage_use_plan_proposal=true confirms it" in text
    )
    drives = [line for line in text.splitlines() if "/dev/disk/by-id/nvme-eui" in line]
    assert len(drives) == 2 and all("3.5 TiB" in d and "SAMSUNG" in d for d in drives), drives
    assert "left out: /dev/nvme0n1: root disk" in text


def test_a_plan_without_a_proposal_says_why(monkeypatch):
    text = plan_text(monkeypatch, "vm_2vcpu")
    assert "storage: nothing proposed: raid0 needs 2 drive(s), found 0 unused NVMe data drive(s)" in text
    assert "drives proposed" not in text
