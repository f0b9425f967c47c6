"""What the monitoring role promises, checked on the target: node_exporter on the one address
it was given, the collectors on, the textfile directory, and the drift check's service and
timer writing metrics that parse in the Prometheus text format."""

from __future__ import annotations

import json
import shlex

import pytest
from prometheus_client.parser import text_string_to_metric_families

from provisioner.checks import as_root, role_constants, role_vars

PACKAGE, SERVICE, DEFAULTS_FILE, STATUS_UNIT, UNIT_DIR, LIBEXEC_DIR = role_constants(
    "monitoring", "package", "service", "defaults_file", "status_unit", "unit_dir", "libexec_dir"
)
SCRIPT = f"{LIBEXEC_DIR}/provisioner-status"
TEXTFILE = "provisioner_status.prom"


@pytest.fixture()
def monitoring(host):
    values = role_vars(host, "monitoring")
    if not values["monitoring_enabled"]:
        pytest.skip("monitoring_enabled is false: the role changed nothing here")
    address = values["monitoring_listen_address"]
    values["listen"] = f"[{address}]:{values['monitoring_port']}" if ":" in address else f"{address}:{values['monitoring_port']}"
    values["originals"] = f"{role_vars(host, 'common')['common_state_dir']}/originals/monitoring.json"
    return values


def _systemd(host) -> bool:
    return host.file("/run/systemd/system").is_directory


def _families(text: str) -> dict:
    """The metric families of a Prometheus text exposition, by name (a parse error fails)."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def _scrape(host, monitoring) -> str:
    """GET /metrics from inside the server, as any local program would."""
    url = f"http://{monitoring['listen']}/metrics"
    code = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=20).read().decode())"
    return host.check_output(f"python3 -c {shlex.quote(code)}")


def _status_metrics(host, monitoring) -> str:
    """Run the drift check once (the timer's service) and read the metrics it wrote."""
    if not _systemd(host):
        pytest.skip("systemd is not PID 1 here: no timer runs the drift check")
    with as_root(host):
        r = host.run(f"systemctl start {STATUS_UNIT}.service")
        assert r.rc == 0, (
            f"{STATUS_UNIT}.service failed: {r.stderr} {host.run(f'journalctl -u {STATUS_UNIT} -n 5 --no-pager').stdout}"
        )
        f = host.file(f"{monitoring['monitoring_textfile_dir']}/{TEXTFILE}")
        assert f.exists, f"{STATUS_UNIT}.service wrote no {f.path}"
        return f.content_string


def test_packages_installed(host):
    assert host.package(PACKAGE).is_installed
    assert host.package("python3-prometheus-client").is_installed


def test_node_exporter_configured(host, monitoring):
    f = host.file(DEFAULTS_FILE)
    assert f.user == "root" and f.mode == 0o644
    args_lines = [line for line in f.content_string.splitlines() if line.startswith("ARGS=")]
    assert len(args_lines) == 1, f"{DEFAULTS_FILE}: {args_lines}"
    args = shlex.split(args_lines[0].split("=", 1)[1])[0].split()
    assert f"--web.listen-address={monitoring['listen']}" in args
    assert [a for a in args if a.startswith("--web.listen-address")] == [f"--web.listen-address={monitoring['listen']}"]
    assert f"--collector.textfile.directory={monitoring['monitoring_textfile_dir']}" in args
    for collector in monitoring["monitoring_collectors"]:
        assert f"--collector.{collector}" in args


def test_node_exporter_listens_on_the_given_address_only(host, monitoring):
    if not _systemd(host):
        pytest.skip("systemd is not PID 1 here: the service does not run")
    assert host.service(SERVICE).is_enabled
    assert host.service(SERVICE).is_running
    port = monitoring["monitoring_port"]
    listening = host.check_output(f"ss -Hltn 'sport = :{port}'").splitlines()
    local = sorted({line.split()[3] for line in listening if line.strip()})
    assert local == [monitoring["listen"]], f"port {port} listens on {local}, not only {monitoring['listen']}"
    assert not host.socket(f"tcp://0.0.0.0:{port}").is_listening
    assert not host.socket(f"tcp://:::{port}").is_listening


def test_metrics_answer_over_http_with_the_collectors_on(host, monitoring):
    if not _systemd(host):
        pytest.skip("systemd is not PID 1 here: the service does not run")
    families = _families(_scrape(host, monitoring))
    assert "node_exporter_build_info" in families
    scraped = {s.labels["collector"] for s in families["node_scrape_collector_success"].samples}
    missing = set(monitoring["monitoring_collectors"]) - scraped
    assert not missing, f"collectors not running: {sorted(missing)}"


def test_textfile_directory_is_the_roles(host, monitoring):
    d = host.file(monitoring["monitoring_textfile_dir"])
    assert d.is_directory
    assert (d.user, d.group, d.mode) == ("root", "root", 0o755)


def test_drift_check_installed_with_its_timer(host, monitoring):
    script = host.file(SCRIPT)
    assert script.is_file and script.user == "root" and script.mode == 0o755
    service = host.file(f"{UNIT_DIR}/{STATUS_UNIT}.service").content_string
    assert f"--textfile {monitoring['monitoring_textfile_dir']}" in service and SCRIPT in service
    timer = host.file(f"{UNIT_DIR}/{STATUS_UNIT}.timer").content_string.splitlines()
    interval = monitoring["monitoring_status_interval"]
    assert f"OnUnitActiveSec={interval}" in timer and f"OnBootSec={interval}" in timer
    if not _systemd(host):
        return
    timer_unit = host.service(f"{STATUS_UNIT}.timer")
    assert timer_unit.is_enabled == bool(monitoring["monitoring_status_timer"])
    assert timer_unit.is_running == bool(monitoring["monitoring_status_timer"])


def test_drift_metrics_parse_and_reach_node_exporter(host, monitoring):
    families = _families(_status_metrics(host, monitoring))
    assert {"provisioner_settings_drifted", "provisioner_status_last_run_timestamp_seconds"} <= set(families)
    drifted = families.get("provisioner_setting_drifted")
    values = [s.value for s in drifted.samples] if drifted else []
    assert set(values) <= {0.0, 1.0}
    assert families["provisioner_settings_drifted"].samples[0].value == sum(values)
    # node_exporter exports the file: its metrics, and when it was written.
    exported = _families(_scrape(host, monitoring))
    assert "provisioner_settings_drifted" in exported
    mtimes = {s.labels["file"] for s in exported["node_textfile_mtime_seconds"].samples}
    assert any(m.endswith(f"/{TEXTFILE}") or m == TEXTFILE for m in mtimes), mtimes
    assert exported["node_textfile_scrape_error"].samples[0].value == 0


def test_originals_recorded_for_undo(host, monitoring):
    with as_root(host):
        f = host.file(monitoring["originals"])
        assert f.exists, f"{monitoring['originals']} missing: undo would not know what to remove"
        data = json.loads(f.content_string)
    assert {SCRIPT, f"{UNIT_DIR}/{STATUS_UNIT}.service", f"{UNIT_DIR}/{STATUS_UNIT}.timer"} <= set(data["created"])
    assert monitoring["monitoring_textfile_dir"] in data["textfile_dirs"]
    assert isinstance(data["package_installed_before"], bool)
