"""Conventions every role keeps: documented options, role and phase tags, lint-clean."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks" / "main.yml").exists())


def load(path: Path):
    return yaml.safe_load(path.read_text()) or {}


@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_documented_with_the_same_default(role):
    defaults = load(ROOT / "roles" / role / "defaults" / "main.yml")
    spec = load(ROOT / "roles" / role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert set(defaults) == set(spec), f"defaults and argument_specs differ: {set(defaults) ^ set(spec)}"
    for name, value in defaults.items():
        assert spec[name].get("description"), f"{name} has no description"
        assert spec[name].get("type"), f"{name} has no type"
        if value is not None and not (isinstance(value, str) and "{{" in value):
            assert spec[name].get("default") == value, f"{name}: default {value!r} vs spec {spec[name].get('default')!r}"
        assert name.startswith(f"{role}_"), f"{name} is not prefixed with the role name"


@pytest.mark.parametrize("role", ROLES)
def test_main_includes_phases_tagged_by_role_and_phase(role):
    tasks = load(ROOT / "roles" / role / "tasks" / "main.yml")
    for task in tasks:
        tags = set(task.get("tags", []))
        assert role in tags, f"{task.get('name')}: missing the role tag {role}"
        assert any(t.startswith(f"{role}_") for t in tags), f"{task.get('name')}: missing a phase tag"


def test_ansible_lint_production_profile():
    bindir = Path(sys.executable).parent
    r = subprocess.run(
        [str(bindir / "ansible-lint"), "roles", "playbooks", "molecule"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}", "NO_COLOR": "1"},
        timeout=300,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
