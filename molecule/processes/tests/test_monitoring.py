"""The same checks `provisioner verify` runs, here against the molecule instance."""

from prometheus_client.parser import text_string_to_metric_families

from provisioner.checks.test_monitoring import *  # noqa: F403
from provisioner.checks.test_monitoring import TEXTFILE, _status_metrics


def test_the_declared_settings_show_as_metrics(host, monitoring):
    """converge declared one setting that holds and one that drifted (nothing mounted there)."""
    text = _status_metrics(host, monitoring)
    samples = {
        s.labels["setting"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "provisioner_setting_drifted"
        for s in family.samples
        if s.labels["role"] == "molecule"
    }
    assert samples == {"root mount": 0.0, "data mount": 1.0}, f"{TEXTFILE}: {samples}"
