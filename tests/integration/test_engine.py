"""The engine on this machine (local connection, read-only playbook)."""

from __future__ import annotations

import json

from provisioner import engine, paths


def _command(result: engine.RunResult) -> list[str]:
    return json.loads((result.artifact_dir / "command").read_text())["command"]


def test_runs_do_not_inherit_each_others_options(tmp_path, monkeypatch):
    """ansible-runner persists cmdline/extravars in its data dir; one run must not leak into the next."""
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path))
    inv = engine.resolve_inventory(None)
    first = engine.run_playbook("facts.yml", inv, check=True, extravars={"plan_trials": 1})
    second = engine.run_playbook("facts.yml", inv)
    assert "--check" in _command(first)
    assert "--check" not in _command(second)
    assert first.facts["localhost"]["provisioner_plan"]["values"]["trials"] == 1
    cores = second.facts["localhost"]["provisioner_hardware"]["cpu"]["cores"]
    assert second.facts["localhost"]["provisioner_plan"]["values"]["trials"] == cores
    assert second.exit_code == 0 and second.hosts["localhost"].changed == 0


def test_artifacts_are_rotated(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(engine, "KEEP_ARTIFACTS", 2)
    inv = engine.resolve_inventory(None)
    for _ in range(3):
        engine.run_playbook("facts.yml", inv, tags=["plan"])
    runs = paths.state_dir() / "runs"
    assert len([p for p in (runs / "artifacts").iterdir() if p.is_dir()]) == 2
    assert [p.name for p in runs.iterdir()] == ["artifacts"], "private data dirs must not pile up"
