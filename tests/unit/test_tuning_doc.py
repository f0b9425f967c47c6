"""docs/tuning.md is where the plan's and the smoke test's rules are written out: every section
the code cites exists, every concern of the plan cites one, and no file outside the repository
is cited."""

import inspect
import re
from pathlib import Path

import pytest

from provisioner import plan, smoke

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "tuning.md"
CODE = [*sorted((ROOT / "provisioner" / "plan").glob("*.py")), ROOT / "provisioner" / "smoke" / "__init__.py"]


def headings() -> set[str]:
    return {m.group(1).strip() for m in re.finditer(r"^#{2,3} (.+)$", DOC.read_text(), re.M)}


def cited(text: str) -> list[str]:
    """Section names quoted after 'docs/tuning.md,' (one or more, like 'A' and 'B')."""
    out = []
    for m in re.finditer(r"docs/tuning\.md,\s*((?:\(?'[^']+'\)?(?:,\s*|\s+and\s+|\s*)?)+)", text):
        out += re.findall(r"'([^']+)'", m.group(1))
    return out


@pytest.mark.parametrize("path", CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_section_the_code_cites_exists(path):
    names = cited(path.read_text())
    assert names, f"{path.name} cites no section of docs/tuning.md"
    missing = sorted(set(names) - headings())
    assert not missing, f"{path.name} cites sections docs/tuning.md does not have: {missing}"


@pytest.mark.parametrize(
    "path", [*CODE, *sorted((ROOT / "provisioner" / "smoke").rglob("*.py"))], ids=lambda p: str(p.relative_to(ROOT))
)
def test_no_citation_of_a_file_outside_the_repository(path):
    assert not re.search(r"TUNING\.md|shared/", path.read_text())


@pytest.mark.parametrize("concern", [*plan.CONCERNS, plan.plan_reboot, plan.plan_storage], ids=lambda f: f.__name__)
def test_every_concern_of_the_plan_cites_its_section(concern):
    names = cited(inspect.getdoc(concern) or "")
    assert names and set(names) <= headings(), f"{concern.__name__} cites {names}"


def test_the_smoke_header_cites_the_limits_section():
    assert "Smoke test limits" in cited(inspect.getdoc(smoke) or "")
