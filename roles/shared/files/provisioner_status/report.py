"""The expected files, the run over every check, its output, and the textfile for node_exporter."""

from __future__ import annotations

import json
import math
import os
import socket
import tempfile
from typing import Any

from provisioner_status.common import DRIFTED, NOT_APPLICABLE, OK, SCHEMA, TEXTFILE_NAME, BadInput
from provisioner_status.probes import Probes
from provisioner_status.sources import describe_source

# ---------------------------------------------------------------- expected files, the run, the output


def load_expected(directory: str) -> list[dict[str, Any]]:
    """Every declared check, with its role, from DIRECTORY/*.json in name order."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except FileNotFoundError as exc:
        raise BadInput(f"never provisioned: no expected state in {directory}", "provision it first") from exc
    except OSError as exc:
        raise BadInput(f"cannot read the expected state in {directory}: {exc.strerror}") from exc
    checks = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            raise BadInput(f"cannot read {path}: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("checks"), list):
            raise BadInput(f"{path} is not a schema {SCHEMA} expected-state file (role, checks)")
        role = str(doc.get("role") or name[: -len(".json")])
        for check in doc["checks"]:
            if not isinstance(check, dict) or not check.get("name") or not hasattr(Probes, f"probe_{check.get('probe')}"):
                raise BadInput(f"{path}: a check without a name or with an unknown probe: {json.dumps(check)[:200]}")
            checks.append({**check, "role": role})
    return checks


def measure_all(checks: list[dict[str, Any]], probes: Probes) -> list[dict[str, Any]]:
    """Every check's setting. A drifted one whose value a file sets gets "source" (file, line,
    managed_by_provisioner) and, when `provisioner up` cannot repair it, "repair" (what does)."""
    settings = []
    probes.checks = checks
    for check in checks:
        try:
            live, state, reason = probes.measure(check)
        except KeyError as exc:
            raise BadInput(f"role {check['role']}, check {check['name']!r}: probe {check['probe']} needs {exc}") from exc
        setting = {
            "role": check["role"],
            "name": check["name"],
            "probe": check["probe"],
            "expected": str(check.get("expected", "")),
            "live": live,
            "state": state,
            "reason": reason,
        }
        source = probes.source(check, live) if state == DRIFTED else None
        if source is not None:
            setting["source"] = source
            if not source["managed_by_provisioner"]:
                setting["repair"] = describe_source(source, str(check.get("var", "")))
        settings.append(setting)
    return settings


def exit_code(settings: list[dict[str, Any]]) -> int:
    return 1 if any(s["state"] == DRIFTED for s in settings) else 0


def report(settings: list[dict[str, Any]], seconds: float, host: str | None = None) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "host": host or socket.gethostname(),
        "seconds": round(seconds, 2),
        "settings": settings,
        "drifted": sum(s["state"] == DRIFTED for s in settings),
    }


def render_table(result: dict[str, Any]) -> str:
    rows = [("role", "setting", "expected", "live", "state")]
    order = {DRIFTED: 0, NOT_APPLICABLE: 2, OK: 1}
    for s in sorted(result["settings"], key=lambda s: order[s["state"]]):
        state = s["state"] + (f": {s['reason']}" if s["reason"] and s["state"] == DRIFTED else "")
        if s.get("repair") and s["state"] == DRIFTED:
            state += f"; {s['repair']}"
        if s["state"] == NOT_APPLICABLE:
            state = s["reason"] if s["reason"].startswith(NOT_APPLICABLE) else f"{NOT_APPLICABLE}: {s['reason']}"
        rows.append((s["role"], s["name"], s["expected"], "" if s["live"] is None else str(s["live"]), state))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows]
    lines.append("")
    lines.append(f"{result['host']}: {result['drifted']} drifted of {len(result['settings'])} settings ({result['seconds']} s)")
    return "\n".join(lines)


# ---------------------------------------------------------------- the textfile for node_exporter


# A metric: (name, help, label names, [(labels, value)]); every one is a gauge.
Metric = tuple[str, str, tuple[str, ...], list[tuple[dict[str, str], float]]]


def metric_samples(result: dict[str, Any], plan: dict[str, Any], now: float) -> list[Metric]:
    """Every metric the textfile holds: drift per setting (not applicable ones left out), the
    count, when it ran, and the plan's values (numbers as values, strings as info labels)."""
    drifted = [
        ({"role": s["role"], "setting": s["name"]}, 1.0 if s["state"] == DRIFTED else 0.0)
        for s in result["settings"]
        if s["state"] != NOT_APPLICABLE
    ]
    values = (plan.get("values") or {}) if isinstance(plan, dict) else {}
    numbers, strings = [], []
    for key in sorted(values):
        value = values[key]
        if isinstance(value, bool):
            numbers.append(({"key": key}, 1.0 if value else 0.0))
        elif isinstance(value, (int, float)) and math.isfinite(value):
            numbers.append(({"key": key}, float(value)))
        elif isinstance(value, str):
            strings.append(({"key": key, "value": value}, 1.0))
    # The ML environment's live generation and the one the last run applied (role mlstack's link setting).
    generations = [
        ({"generation": os.path.basename(str(s["live"] or "")), "expected": os.path.basename(s["expected"])}, 1.0)
        for s in result["settings"]
        if s.get("probe") == "link" and s["role"] == "mlstack"
    ]
    return [
        (
            "provisioner_setting_drifted",
            "1 when the live value of a setting a role manages is not the expected one",
            ("role", "setting"),
            drifted,
        ),
        (
            "provisioner_settings_drifted",
            "Settings whose live value is not the expected one",
            (),
            [({}, float(result["drifted"]))],
        ),
        ("provisioner_status_last_run_timestamp_seconds", "When the drift check last ran", (), [({}, now)]),
        ("provisioner_plan_value", "A numeric value of the plan the host was provisioned with", ("key",), numbers),
        ("provisioner_plan_info", "A string value of the plan the host was provisioned with", ("key", "value"), strings),
        (
            "provisioner_mlstack_generation_info",
            "The ML environment's live generation, and the one the last provisioner run applied",
            ("generation", "expected"),
            generations,
        ),
    ]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_metrics(metrics: list[Metric]) -> str:
    """The Prometheus text exposition format (version 0.0.4), without prometheus_client."""
    lines = []
    for name, text, _labelnames, points in metrics:
        lines.append(f"# HELP {name} {text}")
        lines.append(f"# TYPE {name} gauge")
        for labels, value in points:
            label = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{label}}} {value!r}" if label else f"{name} {value!r}")
    return "\n".join(lines) + "\n"


def write_textfile(directory: str, metrics: list[Metric], use_client: bool = True) -> str:
    """DIRECTORY/provisioner_status.prom, written to a temporary file there and renamed
    (prometheus_client.write_to_textfile when it is importable)."""
    path = os.path.join(directory, TEXTFILE_NAME)
    client = _prometheus_client() if use_client else None
    if client is not None:
        registry = client.CollectorRegistry()
        for name, text, labelnames, points in metrics:
            gauge = client.Gauge(name, text, labelnames, registry=registry)
            for labels, value in points:
                (gauge.labels(**labels) if labels else gauge).set(value)
        client.write_to_textfile(path, registry)
        os.chmod(path, 0o644)
        return path
    fd, tmp = tempfile.mkstemp(prefix=f".{TEXTFILE_NAME}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(render_metrics(metrics))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _prometheus_client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        return None
    return prometheus_client
