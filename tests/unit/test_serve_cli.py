"""`provisioner serve`: bad input refused before any host is touched; the status script's parts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provisioner import commands
from provisioner.cli import app
from provisioner.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]
STATUS_SCRIPT = ROOT / "roles" / "serving" / "files" / "provisioner_serve_status.py"


def _model_dir(tmp_path: Path, meta: object, with_file: bool = True) -> Path:
    d = tmp_path / "v7"
    d.mkdir()
    (d / "metadata.json").write_text(json.dumps(meta))
    if with_file:
        (d / "model.ubj").write_bytes(b"x")
    return d


@pytest.mark.parametrize("model", ["fraud", "fraud/", "/7", "fr aud/7", "fraud/7/x", "-x/1"])
def test_a_model_that_is_not_name_slash_version_is_refused(model):
    with pytest.raises(BadInput, match="is not NAME/VERSION"):
        commands.parse_model_version(model)


def test_name_and_version_are_split():
    assert commands.parse_model_version("fraud-v2/2026.11.30") == ("fraud-v2", "2026.11.30")


def test_a_model_directory_is_checked_on_the_control_node(tmp_path):
    good = {"framework": "xgboost", "file": "model.ubj", "features": ["a", "b"]}
    assert commands.check_model_dir(_model_dir(tmp_path, good))["file"] == "model.ubj"
    with pytest.raises(BadInput, match="no such directory"):
        commands.check_model_dir(tmp_path / "missing")


@pytest.mark.parametrize(
    ("meta", "with_file", "message"),
    [
        ({"framework": "xgboost", "file": "model.ubj", "features": ["a"]}, False, "names the model file 'model.ubj'"),
        ({"framework": "xgboost", "features": ["a"]}, True, "needs 'framework', 'file' and 'features'"),
        (["not", "a", "dict"], True, "needs 'framework'"),
    ],
)
def test_a_bad_model_directory_is_refused_naming_what_is_wrong(tmp_path, meta, with_file, message):
    with pytest.raises(BadInput, match=message):
        commands.check_model_dir(_model_dir(tmp_path, meta, with_file))


def test_serve_load_exits_2_with_one_line_and_touches_no_host(tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    touched = []
    monkeypatch.setattr(commands.engine, "run_playbook", lambda *a, **k: touched.append(a))
    result = CliRunner().invoke(app, ["serve", "load", "fraud/7", "--from", str(tmp_path / "nothing")])
    assert result.exit_code == 2
    assert "no such directory" in result.output
    assert touched == []


def _status_module():
    spec = importlib.util.spec_from_file_location("provisioner_serve_status", STATUS_SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_status_script_sums_requests_per_code_from_real_prometheus_text():
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    registry = CollectorRegistry()
    counter = Counter("provisioner_serving_requests", "requests", ["model", "version", "code"], registry=registry)
    counter.labels("fraud", "1", "200").inc(5)
    counter.labels("fraud", "2", "200").inc(2)
    counter.labels("fraud", "2", "422").inc(1)
    assert _status_module().requests_by_code(generate_latest(registry).decode()) == {"200": 7.0, "422": 1.0}


def test_the_status_script_says_when_no_server_is_deployed(tmp_path):
    run = subprocess.run(
        [sys.executable, str(STATUS_SCRIPT), "--config", str(tmp_path / "serving.json")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2
    assert "not deployed on this host" in run.stderr and "serving_enabled" in run.stderr
    assert run.stdout == ""
