"""testinfra checks that prove a role's result on a target.

`provisioner verify` runs them against an inventory; the molecule scenarios run the
same functions. Each check reads the role's defaults, overlaid with the host's
inventory variables, so it checks what was asked for on that host.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

import yaml

from .. import paths


def role_vars(host: Any, role: str) -> dict[str, Any]:
    """The role's defaults overlaid with the host's inventory variables for that role."""
    defaults = yaml.safe_load((paths.ROLES / role / "defaults" / "main.yml").read_text()) or {}
    try:
        inventory = host.ansible.get_variables()
    except Exception:  # not an ansible:// host: defaults only
        inventory = {}
    prefix = f"{role}_"
    return {**defaults, **{k: v for k, v in inventory.items() if k.startswith(prefix)}}


@contextmanager
def as_root(host: Any) -> Iterator[None]:
    """Run the enclosed commands as root: directly when logged in as root, else through sudo."""
    ctx = nullcontext() if host.user().uid == 0 else host.sudo()
    with ctx:
        yield
