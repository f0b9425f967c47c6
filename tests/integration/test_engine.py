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
    monkeypatch.setattr(engine.runner, "KEEP_ARTIFACTS", 2)
    inv = engine.resolve_inventory(None)
    for _ in range(3):
        engine.run_playbook("facts.yml", inv, tags=["plan"])
    runs = paths.state_dir() / "runs"
    assert len([p for p in (runs / "artifacts").iterdir() if p.is_dir()]) == 2
    assert [p.name for p in runs.iterdir()] == ["artifacts"], "private data dirs must not pile up"


def test_the_connect_timeout_reaches_ssh_and_a_host_var_wins(tmp_path, monkeypatch):
    """--connect-timeout is Ansible's timeout: ssh's ConnectTimeout for every host, except one whose
    inventory sets ansible_timeout (the lab VMs' 60 s). Two lab addresses nothing answers on."""
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(engine.ssh, "_connect_timeout", engine.DEFAULT_CONNECT_TIMEOUT)
    engine.set_connect_timeout(2)
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  hosts:\n"
        "    gone-a: {ansible_host: 10.213.250.2}\n"
        "    gone-b: {ansible_host: 10.213.250.3, ansible_timeout: 3}\n"
    )
    run = engine.run_playbook("facts.yml", inv, verbosity=3)
    assert {h.host: h.status for h in run.hosts.values()} == {"gone-a": "unreachable", "gone-b": "unreachable"}
    log = (run.artifact_dir / "stdout").read_text()
    commands = [ln for ln in log.splitlines() if "SSH: EXEC ssh" in ln]
    assert any("10.213.250.2" in c and "ConnectTimeout=2" in c for c in commands), commands
    assert any("10.213.250.3" in c and "ConnectTimeout=3" in c for c in commands), commands
