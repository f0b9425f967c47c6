"""Every molecule scenario, run for real on lab servers: check, converge, idempotence, verify."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))
# What every scenario shares; molecule finds it at the repository's root.
BASE = ROOT / ".config" / "molecule" / "config.yml"


def scenario_config(scenario: str) -> dict[str, Any]:
    """The scenario's configuration as molecule reads it: its molecule.yml merged over the base
    by molecule's own merge (mappings key by key; a list or a value replaces the base's)."""
    from molecule.util import merge_dicts

    return merge_dicts(yaml.safe_load(BASE.read_text()), own_config(scenario))


def own_config(scenario: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((ROOT / "molecule" / scenario / "molecule.yml").read_text())
    return config


def repeats(base: object, own: object, path: str = "") -> list[str]:
    """The settings of OWN that only repeat the base's value."""
    if isinstance(base, dict) and isinstance(own, dict):
        return [r for k, v in own.items() if k in base for r in repeats(base[k], v, f"{path}.{k}")]
    return [path] if base == own else []


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_sets_only_what_differs(scenario: str) -> None:
    # Shared settings live once, in the base, so a change to them reaches every scenario.
    assert repeats(yaml.safe_load(BASE.read_text()), own_config(scenario)) == []


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_sequence_proves_the_role(scenario: str) -> None:
    sequence = scenario_config(scenario)["scenario"]["test_sequence"]
    # check mode on a fresh server, then converge, a second run with changed=0, testinfra.
    assert sequence.index("check") < sequence.index("converge") < sequence.index("idempotence") < sequence.index("verify")


def mitogen_env() -> dict[str, str]:
    """The scenarios run with Mitogen's linear strategy, the one PROVISIONER_STRATEGY=mitogen
    selects (the integration tests run Ansible's default): each strategy runs every role."""
    from provisioner.engine import _strategy_env

    return _strategy_env("mitogen")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule(scenario: str, lab_requirements: object) -> None:
    bindir = Path(sys.executable).parent
    r = subprocess.run(
        [str(bindir / "molecule"), "test", "-s", scenario],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        env={
            **os.environ,
            **mitogen_env(),
            "PATH": f"{bindir}:{os.environ.get('PATH', '')}",
            "ANSIBLE_NOCOLOR": "1",
            "PY_COLORS": "0",
        },
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    assert "idempotence" in (r.stdout + r.stderr).lower()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_checks_host_keys_and_keeps_connections_only_within_its_servers_life(scenario: str) -> None:
    config = scenario_config(scenario)
    env = config["provisioner"]["env"]
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    # The Ansible runs: ssh keeps the first value of an option, and these come first.
    assert "ControlMaster=no" in env["ANSIBLE_SSH_ARGS"] and "StrictHostKeyChecking=yes" in env["ANSIBLE_SSH_ARGS"]
    # The checks' kept connections: sockets in the scenario's own directory, closed by its create
    # (what an interrupted run left) and its destroy, before any server goes or comes.
    options = config["driver"]["ssh_connection_options"]
    assert "-o ControlPath=${MOLECULE_EPHEMERAL_DIRECTORY}/mux-%C" in options, options
    for step in ("create", "destroy"):
        book = ROOT / "molecule" / scenario / config["provisioner"]["playbooks"][step]
        plays = yaml.safe_load(book.read_text())
        while "ansible.builtin.import_playbook" in plays[-1]:  # the lab servers' play comes last
            book = book.parent / plays[-1]["ansible.builtin.import_playbook"]
            plays = yaml.safe_load(book.read_text())
        first = plays[-1]["tasks"][0]
        assert first.get("ansible.builtin.import_tasks", "").endswith("close_connections.yml"), (book, first)
