# Copyright: provisioner contributors
# Apache License 2.0 (see pyproject.toml)
"""Filters that give the roles provisioner's shared values, so no role keeps a copy in Jinja.

- ``'NAME' | provisioner_constant``: a choice list, limit or forbidden path list from
  plugins/module_utils/provisioner_constants.py (the file the modules and the plan read), as the
  provisioner package's ``provisioner.constants`` gives it.
- ``numa_nodes | provisioner_numa_balancing(tuned_profile)``: the plan's kernel.numa_balancing
  rule (provisioner.plan), the standalone fallback of cpu_tuning_numa_balancing.
- ``recorded | provisioner_originals_grow(current, keys)``: an undo record with the lists under
  ``keys`` extended by what a later run adds (role _common, tasks/record.yml).
"""

from __future__ import annotations

from ansible.errors import AnsibleError, AnsibleFilterError

# The package reads plugins/module_utils/provisioner_constants.py; galaxy.yml: it is installed.
try:
    from provisioner import constants
    from provisioner.plan import numa_balancing
except ImportError as exc:
    raise AnsibleError(f"the provisioner filters: pip install provisioner on the control node ({exc})") from exc


def provisioner_constant(name):
    """The value of one constant; tuples come back as lists (YAML and Jinja lists)."""
    value = getattr(constants.source(), str(name), None)
    if value is None or str(name).startswith("_") or not str(name).isupper():
        raise AnsibleFilterError(f"provisioner_constant: no constant {name!r} in {constants.SOURCE}")
    return list(value) if isinstance(value, tuple) else value


def provisioner_numa_balancing(numa_nodes, tuned_profile):
    """kernel.numa_balancing as the plan sets it: None on one node, else by tuned profile."""
    return numa_balancing(int(numa_nodes), str(tuned_profile))


def provisioner_originals_grow(recorded, current, keys):
    """RECORDED with each list under KEYS followed by CURRENT's items it lacks (order kept).

    Everything else stays as the first run recorded it: those are the true originals."""
    grown = dict(recorded)
    for key in keys:
        items = list(grown.get(key) or [])
        items += [item for item in (current.get(key) or []) if item not in items]
        grown[key] = items
    return grown


class FilterModule:
    def filters(self):
        return {
            "provisioner_constant": provisioner_constant,
            "provisioner_numa_balancing": provisioner_numa_balancing,
            "provisioner_originals_grow": provisioner_originals_grow,
        }
