"""Every molecule scenario, run for real on lab servers: check, converge, idempotence, verify."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_sequence_proves_the_role(scenario):
    sequence = yaml.safe_load((ROOT / "molecule" / scenario / "molecule.yml").read_text())["scenario"]["test_sequence"]
    # check mode on a fresh server, then converge, a second run with changed=0, testinfra.
    assert sequence.index("check") < sequence.index("converge") < sequence.index("idempotence") < sequence.index("verify")


def mitogen_env() -> dict[str, str]:
    """The scenarios run with Mitogen's linear strategy, the one PROVISIONER_STRATEGY=mitogen
    selects (the integration tests run Ansible's default): each strategy runs every role."""
    from provisioner.engine import _strategy_env

    return _strategy_env("mitogen")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule(scenario, lab_requirements):
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
def test_scenario_checks_host_keys_and_keeps_no_mux(scenario):
    env = yaml.safe_load((ROOT / "molecule" / scenario / "molecule.yml").read_text())["provisioner"]["env"]
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert "ControlMaster=no" in env["ANSIBLE_SSH_ARGS"] and "StrictHostKeyChecking=yes" in env["ANSIBLE_SSH_ARGS"]
