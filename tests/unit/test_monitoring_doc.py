"""docs/monitoring.md keeps its alert rules honest: they parse as Prometheus rule YAML, and every
expression names only metrics that are exported (ours, rendered here for real, and those of
node_exporter's collectors that role monitoring turns on), with labels those metrics carry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from status_modules import report

from provisioner import metrics, paths
from provisioner.smoke import Check, HostReport

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "monitoring.md"

# node_exporter's metrics the rules may name: (collector, labels). The collector must be one
# role monitoring turns on.
NODE_EXPORTER = {
    "node_md_disks": ("mdadm", {"device", "state"}),
    "node_md_disks_required": ("mdadm", {"device"}),
    "node_md_state": ("mdadm", {"device", "state"}),
    "node_textfile_mtime_seconds": ("textfile", {"file"}),
    "node_textfile_scrape_error": ("textfile", set()),
}
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"instance", "job"}
PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}


def exported() -> dict[str, set[str]]:
    """Every metric name we export with its label names: both textfiles rendered for real."""
    smoke = HostReport("h", "tuned", "quick", "2026-12-01T10:00:00Z", 1.0, {}, [
        Check("compute.dgemm_all", "compute", "DGEMM", "pass", "ok", 10.0, "GFLOPS", 12.0, ratio=10 / 12)])
    setting = {"role": "cpu_tuning", "name": "swappiness", "probe": "sysctl", "expected": "10", "live": "60",
               "state": "drifted", "reason": ""}
    result = report.report([setting], 0.1, host="h")
    plan = {"values": {"threads_per_job": 2, "thp": "madvise"}}
    status = report.render_metrics(report.metric_samples(result, plan, 0.0))
    out: dict[str, set[str]] = {}
    for text in (metrics.smoke_text(smoke), status):
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, set()).update(sample.labels)
    for name, (_, labels) in NODE_EXPORTER.items():
        out[name] = set(labels)
    return out


def rules() -> list[dict]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    docs = [yaml.safe_load(b) for b in blocks]
    groups = [g for d in docs if isinstance(d, dict) and "groups" in d for g in d["groups"]]
    return [r for g in groups for r in g["rules"]]


def names_in(expr: str) -> list[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords,
    label names (in braces or by/on/ignoring lists) or inside strings."""
    bare = re.sub(r'"[^"]*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}", "{}", bare)
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", bare)
    tokens = [m.group() for m in re.finditer(r"[a-zA-Z_:][\w:]*", bare) if not bare[m.end():].lstrip().startswith("(")]
    return [t for t in tokens if t not in PROMQL_WORDS]


def matchers_in(expr: str) -> list[tuple[str, set[str]]]:
    """(metric, label names matched) for every selector with braces."""
    selectors = re.findall(r"([a-zA-Z_:][\w:]*)\{([^}]*)\}", expr)
    return [(m, set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", body))) for m, body in selectors]


def test_the_doc_has_the_four_kinds_of_rule():
    alerts = {r["alert"] for r in rules()}
    assert alerts == {"ProvisionerSettingDrifted", "ProvisionerArrayDegraded", "ProvisionerSmokeFigureBelowLimit",
                      "ProvisionerMetricsStale"}
    for r in rules():
        assert r["labels"]["severity"] in ("info", "warning", "critical"), r
        assert r["annotations"]["summary"] and r["annotations"]["description"], r


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_every_expression_names_only_exported_metrics(rule):
    known = exported()
    names = names_in(rule["expr"])
    assert names, f"{rule['alert']}: names no metric"
    unknown = sorted(set(names) - set(known))
    assert not unknown, f"{rule['alert']}: {unknown} are not exported (known: {sorted(known)})"
    for metric, labels in matchers_in(rule["expr"]):
        assert labels <= known[metric] | TARGET_LABELS, f"{rule['alert']}: {metric} has no label {labels - known[metric]}"
    # The annotations' $labels are labels of the series the expression returns.
    used = set(re.findall(r"\$labels\.(\w+)", str(rule["annotations"])))
    carried = set().union(*(known[n] for n in names)) | TARGET_LABELS
    assert used <= carried, f"{rule['alert']}: annotations use {used - carried}"


def test_the_node_exporter_metrics_come_from_collectors_role_monitoring_enables():
    defaults = yaml.safe_load((paths.ROLES / "monitoring" / "defaults" / "main.yml").read_text())
    assert {collector for collector, _ in NODE_EXPORTER.values()} <= set(defaults["monitoring_collectors"])


def test_the_tables_list_every_metric_we_export():
    text = DOC.read_text()
    ours = sorted(n for n in exported() if n.startswith("provisioner_"))
    assert ours and all(f"`{n}`" in text for n in ours), [n for n in ours if f"`{n}`" not in text]


def test_the_expression_reader_finds_names_and_skips_the_rest():
    expr = 'time() - node_textfile_mtime_seconds{file=~"x_y.prom"} > 3 * 3600 or sum by (role) (provisioner_x) == 1'
    assert names_in(expr) == ["node_textfile_mtime_seconds", "provisioner_x"]
    assert matchers_in(expr) == [("node_textfile_mtime_seconds", {"file"})]
