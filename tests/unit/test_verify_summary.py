"""`provisioner verify` in one line per host and role; -v and JSON keep every check."""

from __future__ import annotations

import io

from provisioner import render
from provisioner.verify import CheckResult, VerifyResult, summarize

FAILURE = "AssertionError: /etc/provisioner is mode 0o700, expected 0o755 (the ML user must read the plan there)"
CHECKS = [
    CheckResult("web1", "test_base_packages_installed", "passed", role="common"),
    CheckResult("web1", "test_provisioner_directories[common_config_dir]", "failed", FAILURE, "common"),
    CheckResult("web1", "test_applied_plan_recorded", "passed", role="common"),
    CheckResult("web1", "test_hugepages_reserved", "skipped", "hugepages_count is 0: nothing configured", "hugepages"),
    CheckResult("web1", "test_hugetlbfs_mounted", "skipped", "hugepages_count is 0: nothing configured", "hugepages"),
    CheckResult("web1", "test_profile_active", "passed", role="cpu_tuning"),
    CheckResult("web1", "test_governor", "skipped", "scaling_governor is read-only here", "cpu_tuning"),
    CheckResult("web2", "test_base_packages_installed", "passed", role="common"),
]


def test_one_summary_per_host_and_role():
    lines = [(s.host, s.role, s.outcome, s.details) for s in summarize(CHECKS)]
    assert lines == [
        ("web1", "common", "failed", (f"test_provisioner_directories[common_config_dir]: {FAILURE}",)),
        ("web1", "hugepages", "skipped", ("not configured (hugepages_count is 0: nothing configured)",)),
        ("web1", "cpu_tuning", "passed", ("1 check, 1 skipped",)),
        ("web2", "common", "passed", ("1 check",)),
    ]


def test_skips_with_different_reasons_are_not_configured_without_a_reason():
    checks = [CheckResult("h", "a", "skipped", "x", "storage"), CheckResult("h", "b", "skipped", "y", "storage")]
    assert summarize(checks)[0].details == ("not configured",)


def test_each_failure_of_a_role_gets_its_own_line():
    checks = [CheckResult("h", "a", "failed", "x is wrong", "storage"), CheckResult("h", "b", "failed", "", "storage")]
    assert summarize(checks)[0].details == ("a: x is wrong", "b")


def render_to_text(result: VerifyResult, verbose: bool, monkeypatch) -> str:
    out = io.StringIO()
    monkeypatch.delenv("COLUMNS", raising=False)  # as in a pipe or a CI log (pytest-xdist workers set it)
    monkeypatch.setattr(render, "console", render.make_console(file=out))
    render.verify_summary(result, verbose)
    return out.getvalue()


def test_the_table_has_a_row_per_role_and_the_failure_in_full(monkeypatch):
    text = render_to_text(VerifyResult(CHECKS), False, monkeypatch)
    rows = [ln for ln in text.splitlines() if ln.startswith("│")]
    assert len(rows) == 4
    assert FAILURE in text, "the reason of a failure is shown whole, on its row"
    assert "test_hugetlbfs_mounted" not in text


def test_verbose_shows_every_check(monkeypatch):
    text = render_to_text(VerifyResult(CHECKS), True, monkeypatch)
    for c in CHECKS:
        assert c.check in text


def test_json_keeps_every_check_and_adds_the_role_lines():
    data = VerifyResult(CHECKS).to_dict()
    assert [c["check"] for c in data["hosts"]["web1"]] == [c.check for c in CHECKS if c.host == "web1"]
    assert data["roles"]["web1"]["hugepages"] == {
        "outcome": "skipped", "details": ["not configured (hugepages_count is 0: nothing configured)"]
    }
    assert data["exit_code"] == 1
