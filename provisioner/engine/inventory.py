"""What is refused before any host is contacted: a missing or malformed inventory, a --limit
that matches no host, an unknown tag; and Ansible's own tools found beside this interpreter."""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .. import paths
from ..errors import BadInput, ProvisionerError

# Tags every playbook accepts without a role declaring them.
_BUILTIN_TAGS = {"all", "always", "never", "tagged", "untagged"}


def resolve_inventory(inventory: str | Path | None) -> Path:
    """The inventory path to use; None means this machine."""
    path = Path(inventory) if inventory else paths.LOCAL_INVENTORY
    if not path.exists():
        raise BadInput(
            f"inventory {path} does not exist: pass an existing file or directory with -i, or omit -i to provision this machine"
        )
    return path.resolve()


def known_tags() -> set[str]:
    """Every tag declared in the playbooks and roles shipped with provisioner."""
    tags = set(_BUILTIN_TAGS)
    files = list(paths.PLAYBOOKS.glob("*.yml")) + list(paths.ROLES.glob("*/tasks/*.yml"))
    for f in files:
        tags |= _tags_in(yaml.safe_load(f.read_text()))
    return tags


def _tags_in(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        value = node.get("tags")
        if isinstance(value, str):
            found.add(value)
        elif isinstance(value, list):
            found |= {t for t in value if isinstance(t, str)}
        for v in node.values():
            found |= _tags_in(v)
    elif isinstance(node, list):
        for v in node:
            found |= _tags_in(v)
    return found


def check_tags(tags: Sequence[str], skip_tags: Sequence[str]) -> None:
    if not tags and not skip_tags:
        return  # nothing to check: reading every playbook and task file costs a quarter second a run
    known = known_tags()
    unknown = sorted({t for t in (*tags, *skip_tags) if t not in known})
    if unknown:
        raise BadInput(f"unknown tag(s) {', '.join(unknown)}: use one of {', '.join(sorted(known - _BUILTIN_TAGS))}")


def inventory_hosts(inventory: Path) -> dict[str, Any]:
    """Parse the inventory with Ansible itself; a malformed one is refused with Ansible's reason."""
    from ansible_runner.interface import get_inventory

    _check_yaml(inventory)
    ensure_tools_on_path()
    out, err = get_inventory(
        action="list",
        inventories=[str(inventory)],
        response_format="json",
        envvars=_inventory_env(),
        quiet=True,
    )
    if not isinstance(out, dict):
        raise BadInput(f"inventory {inventory} is not valid: {_first_error(str(err) or str(out))}")
    hosts = out.get("_meta", {}).get("hostvars", {})
    for group in out.values():
        if isinstance(group, dict):
            hosts.update({h: hosts.get(h, {}) for h in group.get("hosts", [])})
    if not hosts:
        raise BadInput(f"inventory {inventory} defines no hosts: add at least one host to it")
    return hosts


def _check_yaml(inventory: Path) -> None:
    """A YAML inventory that is not YAML: say where, as PyYAML sees it."""
    files = [inventory] if inventory.is_file() else sorted(inventory.rglob("*.y*ml"))
    for f in files:
        if f.suffix not in (".yml", ".yaml"):
            continue
        try:
            yaml.safe_load(f.read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise BadInput(f"inventory {f} is not valid YAML at{where}: {problem}; fix the file and run again") from exc


def _first_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if "Failed to parse inventory with" in ln:
            return ln.split(":", 2)[-1].strip()
    for ln in lines:
        if "ERROR" in ln or "Error" in ln or "error" in ln:
            return re.sub(r"^\[?ERROR\]?:?!?\s*", "", ln)
    return lines[0] if lines else "unknown error"


def _inventory_env() -> dict[str, str]:
    return {
        # An inventory Ansible cannot parse is an error, not a warning and an empty run.
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
        "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "True",
        "ANSIBLE_INVENTORY_ENABLED": "host_list,yaml,ini,auto,toml",
        "ANSIBLE_NOCOLOR": "True",
    }


def ensure_tools_on_path() -> None:
    """ansible-runner shells out to ansible-playbook and ansible-inventory: put the
    interpreter's bin first on PATH, and say so plainly when they are not there."""
    bindir = str(Path(sys.executable).parent)
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if bindir not in parts:
        os.environ["PATH"] = os.pathsep.join([bindir, *parts])
    missing = [tool for tool in ("ansible-playbook", "ansible-inventory") if shutil.which(tool) is None]
    if missing:
        raise ProvisionerError(
            f"{' and '.join(missing)} not found beside {sys.executable}: reinstall provisioner with its "
            "dependencies (bash install.sh, or pipx install .)"
        )


def _patterns(limit: str) -> list[str]:
    """The parts of an Ansible host pattern (a,b or a:b), as Ansible splits it."""
    from ansible.inventory.manager import split_host_pattern

    return [p for p in split_host_pattern(limit) if p]


def check_limit(inventory: Path, limit: str | None) -> None:
    """Refuse --limit here, before any host is contacted, when it or one of its parts matches no
    host of the inventory (Ansible would warn, drop that part and run on the rest, or stop with a
    sentence of its own): the one line names what the inventory has."""
    if not limit:
        return
    from ansible import constants
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    manager = InventoryManager(loader=DataLoader(), sources=[str(inventory)])
    said, constants.HOST_PATTERN_MISMATCH = constants.HOST_PATTERN_MISMATCH, "ignore"  # the refusal says it, once
    try:
        # An exclusion (!x) that excludes nothing harms nothing; @file is read by Ansible.
        missing = [p for p in _patterns(limit) if p[0] not in "!@" and not manager.get_hosts(pattern=p.lstrip("&"))]
        manager.subset(limit)
        if not missing and manager.get_hosts("all"):
            return
    finally:
        constants.HOST_PATTERN_MISMATCH = said
    groups = sorted(g for g in manager.groups if g not in ("all", "ungrouped"))
    hosts = sorted(manager.hosts)
    names = [*(f"group {g}" for g in groups[:10]), *hosts[:10]]
    more = len(groups[10:]) + len(hosts[10:])
    have = ", ".join(names) + (f" and {more} more" if more else "")
    what = f"{', '.join(missing)} {'matches' if len(missing) == 1 else 'match'} no host" if missing else "matches no host"
    raise BadInput(f"--limit {limit}: {what} of {inventory}; name hosts or groups it has: {have}")


def fleet_hosts(inventory: Path, limit: str | None) -> list[str]:
    """The hosts a run reaches: the inventory's, narrowed by --limit as Ansible reads the pattern."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    manager = InventoryManager(loader=DataLoader(), sources=[str(inventory)])
    if limit:
        manager.subset(limit)
    return [h.name for h in manager.get_hosts("all")]
