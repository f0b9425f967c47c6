"""Who may import whom: no module knows both Ansible and the terminal; no import cycles between
the smoke judgement and its report; the CLI reaches the engine only through the commands."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "provisioner"


def imports(module: str) -> set[str]:
    """Every module outside itself a provisioner module (or subpackage: all its files) imports,
    anywhere in it (relative ones resolved: provisioner.X)."""
    sub = PACKAGE / module
    files = sorted(sub.rglob("*.py")) if sub.is_dir() else [PACKAGE / f"{module}.py"]
    found: set[str] = set()
    for path in files:
        # The package a relative import in this file starts from ("provisioner.smoke.workloads").
        here = ["provisioner", *path.relative_to(PACKAGE).parent.parts]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                start = ".".join(here[: len(here) - node.level + 1]) if node.level else ""
                base = ".".join(p for p in (start, node.module or "") if p)
                found.add(base)
                if node.level and not node.module:
                    found |= {f"{base}.{a.name}" for a in node.names}
    own = f"provisioner.{module}"
    return {i for i in found if i != own and not i.startswith(own + ".")}


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
