"""One source per constant: plugins/module_utils/provisioner_constants.py. Every other place that
must spell a value out (argument specs, module documentation) agrees with it, and no other file
holds a copy of a choice list."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import plugin_code
import pytest
import yaml

from provisioner import checks, constants, plan
from provisioner.plan import PlanOptions

ROOT = Path(__file__).resolve().parents[2]
SOURCE = plugin_code.load("module_utils", "provisioner_constants")
FILTERS = plugin_code.load("filter", "provisioner").FilterModule().filters()


def spec_options(role: str) -> dict[tuple[str, str], dict]:
    """Every option of every entry point of ROLE's argument specs, by (entry point, option)."""
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    return {(entry, name): option for entry, body in specs.items() for name, option in (body.get("options") or {}).items()}


def documentation(kind: str, name: str) -> dict:
    tree = ast.parse((plugin_code.PLUGINS / kind / f"{name}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DOCUMENTATION":
            assert isinstance(node.value, ast.Constant) and isinstance(node.value.value, str), name
            return yaml.safe_load(node.value.value)["options"]
    raise AssertionError(f"{name} has no DOCUMENTATION")


def test_the_control_node_reads_the_same_file():
    assert constants.SOURCE == plugin_code.PLUGINS / "module_utils" / "provisioner_constants.py"
    for name in (n for n in dir(SOURCE) if n.isupper()):
        assert getattr(constants, name) == getattr(SOURCE, name), name
    # The plan uses them, it keeps no copy.
    for name in ("THP_CHOICES", "HUGEPAGES_SIZES", "TUNED_PROFILES", "STORAGE_LEVELS", "STORAGE_BACKENDS",
                 "MAX_HUGEPAGES_SHARE", "MIN_DRIVES", "MD_CHUNK_KB", "READ_AHEAD_KB"):
        assert getattr(plan, name) is getattr(constants, name), name


CHOICES = {
    "plan": {
        "plan_thp": SOURCE.THP_CHOICES,
        "plan_thp_defrag": SOURCE.THP_DEFRAG_CHOICES,
        "plan_hugepages_size": (None, *SOURCE.HUGEPAGES_SIZES),
        "plan_tuned_profile": SOURCE.TUNED_PROFILES,
        "plan_storage_level": SOURCE.STORAGE_LEVELS,
        "plan_storage_backend": SOURCE.STORAGE_BACKENDS,
        "plan_serving_allocator": (None, *SOURCE.SERVING_ALLOCATORS),
    },
    "storage": {"storage_level": SOURCE.STORAGE_LEVELS, "storage_backend": SOURCE.STORAGE_BACKENDS},
    "cpu_tuning": {
        "cpu_tuning_tuned_profile": SOURCE.TUNED_PROFILES,
        "cpu_tuning_thp_enabled": SOURCE.THP_CHOICES,
        "cpu_tuning_thp_defrag": SOURCE.THP_DEFRAG_CHOICES,
        "cpu_tuning_apply_live": SOURCE.APPLY_LIVE_MODES,
    },
    "hugepages": {"hugepages_size": SOURCE.HUGEPAGES_SIZES, "hugepages_apply_live": SOURCE.APPLY_LIVE_MODES},
}


@pytest.mark.parametrize("role", sorted(CHOICES))
def test_argument_spec_choices_are_the_constants(role):
    options = spec_options(role)
    for name, expected in CHOICES[role].items():
        found = [option for (_, option_name), option in options.items() if option_name == name]
        assert found, f"{role} documents no {name}"
        for option in found:  # in every entry point that takes it
            assert tuple(option["choices"]) == tuple(expected), f"{role}: {name}"


def test_module_and_action_documentation_agree_with_the_constants():
    storage = documentation("modules", "provisioner_storage")
    assert tuple(storage["level"]["choices"]) == SOURCE.STORAGE_LEVELS
    assert tuple(storage["backend"]["choices"]) == SOURCE.STORAGE_BACKENDS
    assert storage["chunk_kb"]["default"] == SOURCE.MD_CHUNK_KB
    action = documentation("action", "provisioner_plan")
    assert tuple(action["plan_thp"]["choices"]) == SOURCE.THP_CHOICES
    assert tuple(action["plan_thp_defrag"]["choices"]) == SOURCE.THP_DEFRAG_CHOICES
    assert tuple(action["plan_hugepages_size"]["choices"]) == SOURCE.HUGEPAGES_SIZES
    assert tuple(action["plan_tuned_profile"]["choices"]) == SOURCE.TUNED_PROFILES
    assert tuple(action["plan_storage_level"]["choices"]) == SOURCE.STORAGE_LEVELS
    assert tuple(action["plan_storage_backend"]["choices"]) == SOURCE.STORAGE_BACKENDS
    assert tuple(action["plan_serving_allocator"]["choices"]) == SOURCE.SERVING_ALLOCATORS


def _copies(values: tuple[str, ...]) -> list[str]:
    """Files outside the allowed places that spell VALUES out as a list, in order."""
    pattern = re.compile(r"\W+".join(re.escape(v) for v in values))
    allowed = {"provisioner_constants.py", "argument_specs.yml"}
    hits = []
    for base in ("roles", "plugins", "provisioner", "playbooks", "molecule"):
        for path in (ROOT / base).rglob("*"):
            if not path.is_file() or path.suffix not in (".py", ".yml", ".j2") or path.name in allowed:
                continue
            text = path.read_text(errors="replace")
            if path.suffix == ".py" and path.parent.name in ("modules", "action"):
                text = re.sub(r'DOCUMENTATION = r""".*?"""', "", text, flags=re.S)  # checked above
            if pattern.search(text):
                hits.append(str(path.relative_to(ROOT)))
    return hits


@pytest.mark.parametrize(
    "name", ["THP_CHOICES", "TUNED_PROFILES", "STORAGE_LEVELS", "STORAGE_BACKENDS", "APPLY_LIVE_MODES",
             "SYSTEM_MOUNTPOINTS", "SYSTEM_DIRECTORIES", "SERVING_ALLOCATORS"])
def test_no_other_copy_of_a_choice_list(name):
    # The tuner's knob is shipped in the smoke zipapp, which imports no constants: test_tune.py holds its copy equal.
    assert _copies(getattr(SOURCE, name)) == (["provisioner/tune/knobs.py"] if name == "SERVING_ALLOCATORS" else [])


def test_the_filter_gives_roles_the_constants():
    constant = FILTERS["provisioner_constant"]
    assert constant("STORAGE_LEVELS") == list(SOURCE.STORAGE_LEVELS)
    assert constant("HUGEPAGE_KIB") == SOURCE.HUGEPAGE_KIB
    assert constant("MAX_HUGEPAGES_SHARE") == SOURCE.MAX_HUGEPAGES_SHARE
    assert "/dev/hugepages" in constant("HUGETLBFS_REFUSED") and "/data" not in constant("SYSTEM_DIRECTORIES")
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="no constant 'NOPE'"):
        constant("NOPE")


def render_defaults(role: str, **context) -> dict:
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
    return checks._render(defaults, {"provisioner_plan": {}, **context})


def test_standalone_defaults_follow_the_plan_rules():
    """Without a plan, a role's defaults are the plan's defaults and rules, not a Jinja copy."""
    options = PlanOptions()
    storage = render_defaults("storage")
    assert (storage["storage_level"], storage["storage_backend"], storage["storage_mountpoint"]) == (
        options.storage_level, options.storage_backend, options.data_mountpoint)
    assert (storage["storage_chunk_kb"], storage["storage_read_ahead_kb"]) == (SOURCE.MD_CHUNK_KB, SOURCE.READ_AHEAD_KB)
    cpu = render_defaults("cpu_tuning")
    assert (cpu["cpu_tuning_tuned_profile"], cpu["cpu_tuning_thp_enabled"]) == (options.tuned_profile, options.thp)
    for nodes in (1, 2, 4):
        for profile in SOURCE.TUNED_PROFILES:
            cpu = render_defaults("cpu_tuning", _cpu_tuning_numa_nodes=nodes,
                                  provisioner_plan={"values": {"tuned_profile": profile}})
            assert cpu["cpu_tuning_numa_balancing"] == plan.numa_balancing(nodes, profile), (nodes, profile)


def test_the_plan_refuses_every_system_directory_as_the_data_mount():
    for directory in SOURCE.SYSTEM_DIRECTORIES:
        with pytest.raises(plan.PlanError, match="plan_data_mountpoint"):
            PlanOptions(data_mountpoint=directory + "/")
    assert PlanOptions(data_mountpoint="/data").data_mountpoint == "/data"
