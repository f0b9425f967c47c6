"""Who may import whom: no module knows both Ansible and the terminal; no import cycles between
the smoke judgement and its report; the CLI reaches the engine only through the commands."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "provisioner"


def imports(module: str) -> set[str]:
    """Every module a provisioner module imports, anywhere in it (relative ones as provisioner.X)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ("provisioner." + (node.module or "")).rstrip(".") if node.level else (node.module or "")
            found.add(base)
            if node.level and not node.module:
                found |= {f"provisioner.{a.name}" for a in node.names}
    return found


def knows(module: str, *names: str) -> bool:
    return any(i == n or i.startswith(n + ".") for i in imports(module) for n in names)


ANSIBLE = ("ansible", "ansible_runner", "provisioner.engine")
TERMINAL = ("rich", "typer", "provisioner.render")


@pytest.mark.parametrize("module", ["render", "runs", "result", "smoke", "report", "reboot"])
def test_modules_that_render_or_hold_data_know_no_ansible(module):
    assert not knows(module, *ANSIBLE), imports(module)


@pytest.mark.parametrize("module", ["engine", "commands", "runs", "result", "smoke", "report", "verify", "bundle"])
def test_modules_that_run_or_judge_know_no_terminal(module):
    assert not knows(module, *TERMINAL), imports(module)


def test_smoke_and_report_do_not_import_each_other():
    assert knows("report", "provisioner.smoke")
    assert not knows("smoke", "provisioner.report")


def test_the_cli_reaches_the_engine_only_through_the_commands():
    assert not knows("cli", "provisioner.engine", "ansible_runner")
    assert knows("cli", "provisioner.commands")
