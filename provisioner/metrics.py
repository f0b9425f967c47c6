"""The smoke figures as Prometheus metrics, for node_exporter's textfile collector.

After `provisioner smoke` (or `up`'s smoke test) judges a host, the control node renders the
host's figures with prometheus-client into `provisioner_smoke.prom`, keeps it beside the
host's smoke history and pushes it to the host's textfile directory (playbooks/smoke_metrics.yml)
where role monitoring made one. docs/monitoring.md lists every metric and the alert rules.
"""

from __future__ import annotations

import calendar
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, generate_latest, write_to_textfile

from .smoke import HostReport, history_dir

SMOKE_FILE = "provisioner_smoke.prom"

FIGURE = "provisioner_smoke_figure"
LIMIT = "provisioner_smoke_limit"
RATIO = "provisioner_smoke_ratio"
STATUS = "provisioner_smoke_status"
LAST_RUN = "provisioner_smoke_last_run_timestamp_seconds"
# Every metric the smoke file holds (docs/monitoring.md's alert rules may name only these,
# the status script's and node_exporter's).
SMOKE_METRICS = (FIGURE, LIMIT, RATIO, STATUS, LAST_RUN)


def smoke_registry(report: HostReport) -> CollectorRegistry:
    """One host's judged smoke run: each figure, its limit and ratio, its status, and when it ran."""
    registry = CollectorRegistry()
    figure = Gauge(FIGURE, "A smoke figure of the last tuned run, in its unit", ["check", "unit"], registry=registry)
    limit = Gauge(LIMIT, "The limit the hardware sets for the figure, in the figure's unit", ["check", "unit"], registry=registry)
    ratio = Gauge(RATIO, "Figure divided by its limit", ["check"], registry=registry)
    status = Gauge(STATUS, "1 for the check's status: pass, warn, fail, skip or info", ["check", "status"], registry=registry)
    last = Gauge(LAST_RUN, "When the smoke run started (Unix time)", registry=registry)
    for c in report.checks:
        if c.figure is not None:
            figure.labels(c.id, c.unit).set(c.figure)
        if c.limit is not None:
            limit.labels(c.id, c.unit).set(c.limit)
        if c.ratio is not None:
            ratio.labels(c.id).set(c.ratio)
        status.labels(c.id, c.status).set(1)
    last.set(started_seconds(report.started))
    return registry


def smoke_text(report: HostReport) -> str:
    """The Prometheus text format of `smoke_registry`."""
    return generate_latest(smoke_registry(report)).decode()


def write_smoke(report: HostReport) -> Path:
    """Keep the host's smoke metrics beside its smoke history (written atomically); the path."""
    path = history_dir(report.host) / SMOKE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), smoke_registry(report))
    return path


def started_seconds(started: str) -> float:
    """The run's start (the smoke script's UTC stamp, 2026-12-01T10:00:00Z) as Unix time; now when unknown."""
    try:
        return float(calendar.timegm(time.strptime(started, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return time.time()
