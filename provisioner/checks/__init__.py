"""testinfra checks that prove a role's result on a target.

`provisioner verify` runs them against an inventory; the molecule scenarios run the
same functions. Each check reads the role's options as that host got them: the role's
defaults, overlaid with the host's inventory variables, with defaults derived from the
plan rendered from the plan the host recorded (/etc/provisioner/plan.json).
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import jinja2
import yaml
from jinja2.nativetypes import NativeEnvironment

from .. import paths, zipapp

PLAN_FILE = "/etc/provisioner/plan.json"

# The run's extra variables (`provisioner up -e KEY=VALUE`), set by provisioner.verify for the
# checks that follow that run: as in Ansible, they win over the inventory.
EXTRA_VARS: dict[str, Any] = {}
# The -e options each role's last `provisioner up` applied, as role common recorded them on the
# target (root only: an option may carry an index URL's credentials). A standalone verify judges
# by them, as the run did, without the user repeating them; read once per host (provisioner.verify
# empties this cache around each run of the checks).
OPTIONS_FILE = "/etc/provisioner/options.json"
RECORDED: dict[str, dict[str, Any]] = {}
# What the status script reported on each host, run once for the checks of every role that read
# it (a run takes seconds: login shells, a service, the doctor); emptied with RECORDED.
STATUS: dict[tuple[str, str], list[dict[str, Any]]] = {}


def applied_plan(host: Any) -> dict[str, Any]:
    """The plan recorded on the target by the last run ({} before the first)."""
    f = host.file(PLAN_FILE)
    return json.loads(f.content_string) if f.exists else {}


def recorded_options(host: Any, config_dir: str | None = None) -> dict[str, Any]:
    """The -e options the host's last runs applied ({} before the first, or when a run without the
    CLI wrote none), every role's in one mapping: each role's as the last run that applied it gave them."""
    key = host.backend.get_pytest_id() if hasattr(host, "backend") else str(id(host))
    if key not in RECORDED:
        path = f"{config_dir.rstrip('/')}/options.json" if config_dir else OPTIONS_FILE
        with as_root(host):
            f = host.file(path)
            text = f.content_string if f.exists else ""
        roles = (json.loads(text) if text.strip() else {}).get("roles") or {}
        RECORDED[key] = {k: v for options in roles.values() for k, v in (options or {}).items()}
    return RECORDED[key]


def role_constants(role: str, *names: str) -> tuple[Any, ...]:
    """The role's own constants, `_ROLE_NAME` in roles/ROLE/vars/main.yml, in the order named:
    what the role writes where, which the checks look for."""
    values = yaml.safe_load((paths.ROLES / role / "vars" / "main.yml").read_text())
    return tuple(values[f"_{role}_{name}"] for name in names)


def role_vars(host: Any, role: str) -> dict[str, Any]:
    """The role's options for this host: defaults, inventory overrides, the options the last runs
    recorded, the run's extra variables, plan-derived values."""
    defaults = yaml.safe_load((paths.ROLES / role / "defaults" / "main.yml").read_text()) or {}
    try:
        inventory = host.ansible.get_variables()
    except Exception:  # not an ansible:// host: defaults only
        inventory = {}
    config_dir = inventory.get("common_config_dir")
    recorded = recorded_options(host, config_dir if isinstance(config_dir, str) and "{{" not in config_dir else None)
    inventory = {**inventory, **recorded, **EXTRA_VARS}
    prefix = f"{role}_"
    merged = {**defaults, **{k: v for k, v in inventory.items() if k.startswith(prefix)}}
    if any(isinstance(v, str) and "{{" in v for v in merged.values()):
        merged = _render(merged, {**inventory, "provisioner_plan": applied_plan(host)})
    return merged


def _render(values: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    # Native types, as Ansible gives them: a null plan value stays None, a count an int.
    env = NativeEnvironment(undefined=jinja2.ChainableUndefined)
    env.filters.update(_ansible_filters())
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, str) and "{{" in value:
            try:
                value = env.from_string(value).render({**context, **out})
            except jinja2.TemplateError:
                value = None  # needs what only a play knows (gathered facts): unknown here
        out[key] = value
    return out


def _ansible_filters() -> dict[str, Any]:
    from ansible.plugins.filter.core import FilterModule as Core
    from ansible.plugins.filter.mathstuff import FilterModule as Math

    filters = {**Core().filters(), **Math().filters(), **_project_filters()}
    filters.pop("default", None)  # Ansible's wraps its own Undefined type; jinja2's is the same rule
    return filters


@functools.cache
def _project_filters() -> dict[str, Any]:
    """The filters the roles' defaults use from plugins/filter/provisioner.py."""
    spec = importlib.util.spec_from_file_location("provisioner_filters", paths.PLUGINS / "filter" / "provisioner.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    filters: dict[str, Any] = module.FilterModule().filters()
    return filters


@contextmanager
def as_root(host: Any) -> Iterator[None]:
    """Run the enclosed commands as root: directly when logged in as root, else through sudo."""
    ctx = nullcontext() if host.user().uid == 0 else host.sudo()
    with ctx:
        yield


STATUS_PACKAGE = paths.ROLES / "shared" / "files" / "provisioner_status"


def status_program(code: str) -> str:
    """A `python3 -c` program that runs CODE on the host with role shared's drift check importable
    (`import provisioner_status...`): its zipapp, built as the roles ship it, travels inside the
    program (base64, about 70 kB: well under one argument's 128 kB), is written to a temporary
    file, put on sys.path for CODE and removed after it."""
    data = base64.b64encode(zipapp.archive(zipapp.package_entries(STATUS_PACKAGE))).decode()
    return (
        "import base64, os, sys, tempfile\n"
        "fd, path = tempfile.mkstemp(suffix='.pyz')\n"
        f"with os.fdopen(fd, 'wb') as f:\n    f.write(base64.b64decode({data!r}))\n"
        "sys.path.insert(0, path)\n"
        "try:\n" + textwrap.indent(code, "    ") + "finally:\n    os.unlink(path)\n"
    )
