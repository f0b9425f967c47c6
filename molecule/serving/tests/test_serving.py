"""The checks `provisioner verify` runs (provisioner/checks/test_serving.py), here against the
molecule instance, and the predictions of the models converge copied there."""

from __future__ import annotations

import pytest

from provisioner.checks.test_serving import *  # noqa: F403
from provisioner.checks.test_serving import _http, _show

# What the models of files/models predict for an all-zero row (train_models.py, checked with
# the same xgboost and scikit-learn on the control node).
ZERO_ROW = {("fraud", "1"): 0.43210882, ("fraud", "2"): 0.37062454, ("churn", "1"): -0.45676306}


def test_every_worker_loaded_the_three_versions(host, serving):
    config = serving["config"]
    for worker in config["workers"]:
        status, models = _http(host, "GET", f"http://127.0.0.1:{config['admin_port_base'] + worker['index']}/v1/models")
        assert status == 200
        loaded = {(m["name"], m["version"]) for m in models["models"] if m["loaded"]}
        assert loaded == set(ZERO_ROW), f"worker {worker['index']} loaded {loaded}"


def test_a_predict_over_http_answers_from_the_registry(host, serving):
    base = f"http://127.0.0.1:{serving['config']['port']}/v1/models"
    for (name, version), expected in ZERO_ROW.items():
        names = [f"f{i}" for i in range(8)] if name == "fraud" else ["tenure", "spend", "calls", "age"]
        status, body = _http(host, "POST", f"{base}/{name}/{version}/predict", {"features": dict.fromkeys(names, 0.0)})
        assert status == 200, body
        assert (body["model"], body["version"]) == (name, version)
        assert body["prediction"] == pytest.approx(expected, abs=1e-5)
        status, batch = _http(
            host, "POST", f"{base}/{name}/{version}/predict/batch", {"rows": [[0.0] * len(names), [1.0] * len(names)]}
        )
        assert status == 200 and len(batch["predictions"]) == 2, batch
        assert batch["predictions"][0] == pytest.approx(expected, abs=1e-5)
    # latest: the highest version.
    status, body = _http(host, "POST", f"{base}/fraud/latest/predict", {"features": {f"f{i}": 0.0 for i in range(8)}})
    assert (status, body["version"]) == (200, "2")


def test_bad_requests_get_4xx_and_the_workers_keep_serving(host, serving):
    base = f"http://127.0.0.1:{serving['config']['port']}/v1/models"
    status, body = _http(host, "POST", f"{base}/fraud/2/predict", {"features": {"f0": 1.0}})
    assert status == 422 and "f1" in body["error"], body
    assert _http(host, "POST", f"{base}/nosuch/1/predict", {"features": {}})[0] == 404
    assert _http(host, "POST", f"{base}/fraud/9/predict", {"features": {}})[0] == 404
    for unit in serving["instances"]:
        assert _show(host, unit, "ActiveState")["ActiveState"] == "active"
