"""Role monitoring: the interval parser (a systemd time span) and the preflight's refusals,
run on this machine before anything changes."""

from __future__ import annotations

from pathlib import Path

import pytest
from playbook_cases import Run, local_host, run_cases
from plugin_code import load

ROOT = Path(__file__).resolve().parents[2]
timespan = load("filter", "monitoring").monitoring_timespan_seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1h", 3600), ("30min", 1800), ("90", 90), ("1h 30min", 5400), ("1h30m", 5400), ("2 hours", 7200),
        ("1.5h", 5400), ("60s", 60), ("1d", 86400), ("1w", 604800), ("1M", 2629800), ("500ms", 0.5), (" 5min ", 300),
    ],
)
def test_a_systemd_time_span_in_seconds(text, seconds):
    assert timespan(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "h", "1 hour and a bit", "-1h", "1hx", "1 fortnight", None, "1h,30min"])
def test_what_is_not_a_time_span_gives_none(text):
    assert timespan(text) is None


def test_m_is_minutes_and_capital_m_months():
    assert timespan("5m") == 300 and timespan("5M") == 5 * 2629800


PREFLIGHT = [{
    "name": "Preflight", "hosts": "all", "gather_facts": False,
    "tasks": [{"name": "Check the input of role monitoring",
               "ansible.builtin.include_role": {"name": "monitoring", "tasks_from": "preflight"}}],
}]
# One ansible-playbook run for all of them (playbook_cases): one host per case, its variables the
# case's input.
BAD_INPUT = [
    ("monitoring_listen_address", "203.0.113.7", "monitoring_listen_address must be one of {host}'s own addresses"),
    ("monitoring_listen_address", "0.0.0.0", "monitoring_listen_address must be one of {host}'s own addresses"),
    ("monitoring_textfile_dir", "/etc/node-exporter", "monitoring_textfile_dir must be a directory under /var/lib"),
    ("monitoring_textfile_dir", "/var/lib/../etc", "monitoring_textfile_dir must be a directory under /var/lib"),
    ("monitoring_textfile_dir", "/var/lib", "monitoring_textfile_dir must be a directory under /var/lib"),
    ("monitoring_status_interval", "30s", "monitoring_status_interval must be a systemd time span of one minute or more"),
    ("monitoring_status_interval", "hourly", "monitoring_status_interval must be a systemd time span of one minute or more"),
    ("monitoring_port", 0, "monitoring_port must be 1..65535"),
    ("monitoring_collectors", ["cpufreq", "--web.listen-address=:9100"], "monitoring_collectors must list"),
]
CASE_HOSTS = {f"bad{i}": local_host({option: value}) for i, (option, value, _) in enumerate(BAD_INPUT)}
GOOD = "good"


@pytest.fixture(scope="module")
def preflight_run(tmp_path_factory):
    good = {"monitoring_listen_address": "::1", "monitoring_status_interval": "1min",
            "monitoring_textfile_dir": "/var/lib/node-textfile"}
    return run_cases(tmp_path_factory, "monitoring-preflight", PREFLIGHT, {**CASE_HOSTS, GOOD: local_host(good)}, cwd=ROOT)


def _refusals(run: Run, host: str) -> list[tuple[str, str]]:
    return [(name, result["msg"]) for name, result in run.failed(host)]


def test_a_run_with_bad_input_fails(preflight_run):
    assert preflight_run.returncode == 2, preflight_run.tail()


@pytest.mark.parametrize(("host", "option", "value", "says"), [(h, *case) for h, case in zip(CASE_HOSTS, BAD_INPUT, strict=True)],
                         ids=list(CASE_HOSTS))
def test_bad_input_is_refused_in_one_line_naming_the_option(preflight_run, host, option, value, says):
    refusals = _refusals(preflight_run, host)
    assert len(refusals) == 1, refusals
    task, msg = refusals[0]
    assert task == f"monitoring : Check {option}"
    assert msg.startswith(says.format(host=host)) and "\n" not in msg.strip(), msg
    assert str(value) in msg


def test_good_input_passes_the_preflight(preflight_run):
    stats = preflight_run.stats(GOOD)
    assert stats["failures"] == 0 and stats["unreachable"] == 0 and stats["ok"] > 0, preflight_run.tail()
