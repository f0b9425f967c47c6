# -*- coding: utf-8 -*-
# Copyright: provisioner contributors
# Apache License 2.0 (see pyproject.toml)
"""Filters that give the roles provisioner's shared values, so no role keeps a copy in Jinja.

- ``'NAME' | provisioner_constant``: a choice list, limit or forbidden path list from
  plugins/module_utils/provisioner_constants.py (the file the modules and the plan read).
- ``numa_nodes | provisioner_numa_balancing(tuned_profile)``: the plan's kernel.numa_balancing
  rule (provisioner.plan), the standalone fallback of cpu_tuning_numa_balancing.
- ``recorded | provisioner_originals_grow(current, keys)``: an undo record with the lists under
  ``keys`` extended by what a later run adds (role _common, tasks/record.yml).
"""

from __future__ import annotations

import importlib.util
import os
import sys

from ansible.errors import AnsibleFilterError

_CONSTANTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "module_utils", "provisioner_constants.py")
_loaded = {}


def _constants():
    if "module" not in _loaded:
        spec = importlib.util.spec_from_file_location("provisioner_constants", _CONSTANTS)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _loaded["module"] = module
    return _loaded["module"]


def provisioner_constant(name):
    """The value of one constant; tuples come back as lists (YAML and Jinja lists)."""
    value = getattr(_constants(), str(name), None)
    if value is None or str(name).startswith("_") or not str(name).isupper():
        raise AnsibleFilterError("provisioner_constant: no constant %r in %s" % (name, os.path.normpath(_CONSTANTS)))
    return list(value) if isinstance(value, tuple) else value


def provisioner_numa_balancing(numa_nodes, tuned_profile):
    """kernel.numa_balancing as the plan sets it: None on one node, else by tuned profile."""
    try:
        from provisioner.plan import numa_balancing
    except ImportError:  # plain ansible-playbook without the package installed: use the checkout's copy
        sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
        from provisioner.plan import numa_balancing
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
