"""Role monitoring: the interval parser (a systemd time span) and the preflight's refusals,
run on this machine before anything changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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


def _preflight(extra: dict) -> subprocess.CompletedProcess:
    bindir = Path(sys.executable).parent
    args = [str(bindir / "ansible-playbook"), "-i", "localhost,", "/dev/stdin",
            "-e", json.dumps(extra), "-e", f"ansible_python_interpreter={sys.executable}"]
    play = yaml.safe_dump([{
        "name": "Preflight", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "tasks": [{"name": "Check the input of role monitoring",
                   "ansible.builtin.include_role": {"name": "monitoring", "tasks_from": "preflight"}}],
    }])
    return subprocess.run(
        args, input=play, cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}", "ANSIBLE_NOCOLOR": "1",
             "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json", "ANSIBLE_LOCALHOST_WARNING": "false"},
    )


def _refusals(r: subprocess.CompletedProcess) -> list[tuple[str, str]]:
    tasks = json.loads(r.stdout)["plays"][0]["tasks"]
    return [(t["task"]["name"], t["hosts"]["localhost"]["msg"]) for t in tasks if t["hosts"]["localhost"].get("failed")]


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("monitoring_listen_address", "203.0.113.7", "monitoring_listen_address must be one of localhost's own addresses"),
        ("monitoring_listen_address", "0.0.0.0", "monitoring_listen_address must be one of localhost's own addresses"),
        ("monitoring_textfile_dir", "/etc/node-exporter", "monitoring_textfile_dir must be a directory under /var/lib"),
        ("monitoring_textfile_dir", "/var/lib/../etc", "monitoring_textfile_dir must be a directory under /var/lib"),
        ("monitoring_textfile_dir", "/var/lib", "monitoring_textfile_dir must be a directory under /var/lib"),
        ("monitoring_status_interval", "30s", "monitoring_status_interval must be a systemd time span of one minute or more"),
        ("monitoring_status_interval", "hourly", "monitoring_status_interval must be a systemd time span of one minute or more"),
        ("monitoring_port", 0, "monitoring_port must be 1..65535"),
        ("monitoring_collectors", ["cpufreq", "--web.listen-address=:9100"], "monitoring_collectors must list"),
    ],
)
def test_bad_input_is_refused_in_one_line_naming_the_option(option, value, says):
    r = _preflight({option: value})
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-2000:]
    refusals = _refusals(r)
    assert len(refusals) == 1, refusals
    task, msg = refusals[0]
    assert task == f"monitoring : Check {option}"
    assert msg.startswith(says) and "\n" not in msg.strip(), msg
    assert str(value) in msg


def test_good_input_passes_the_preflight():
    r = _preflight({"monitoring_listen_address": "::1", "monitoring_status_interval": "1min",
                    "monitoring_textfile_dir": "/var/lib/node-textfile"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
