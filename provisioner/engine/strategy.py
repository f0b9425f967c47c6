"""Which execution strategy a playbook runs with: Ansible's own linear one, or Mitogen's."""

from __future__ import annotations

from .. import paths
from ..errors import BadInput

# The execution strategy (see _strategy_env), PROVISIONER_STRATEGY=linear|mitogen for every
# playbook. Unset: Mitogen's for the playbooks of many module tasks (a no-op re-run of site.yml
# takes half the time), Ansible's own for the rest: one task or a few per host, where Mitogen
# gains nothing, and `script` tasks, whose stderr Mitogen does not hand back apart (the status
# script's one-line reason became "Shared connection to HOST closed").
STRATEGY_ENV = "PROVISIONER_STRATEGY"
DEFAULT_STRATEGY = "mitogen"
MITOGEN_PLAYBOOKS = frozenset({"site.yml", "undo.yml"})


def _strategy_env(choice: str | None) -> dict[str, str]:
    """The environment of a strategy: "mitogen" runs Mitogen's linear strategy, one Python
    interpreter kept per host instead of a module sent over SSH for every task; "linear" (or
    None) is Ansible's own, also the way out when Mitogen misbehaves on a host."""
    if not choice or choice == "linear":
        return {}
    if choice != "mitogen":
        raise BadInput(f"{STRATEGY_ENV}={choice!r} is not a strategy provisioner knows: use linear or mitogen")
    import importlib.util

    spec = importlib.util.find_spec("ansible_mitogen")
    if spec is None or not spec.submodule_search_locations:
        raise BadInput(
            f"{STRATEGY_ENV}=mitogen needs the mitogen package beside provisioner: pip install mitogen "
            f"(a dependency of provisioner: reinstall it), or set {STRATEGY_ENV}=linear"
        )
    # Mitogen's linear strategy with its CPU pinning switched off (plugins/strategy says why).
    return {
        "ANSIBLE_STRATEGY_PLUGINS": str(paths.PLUGINS / "strategy"),
        "ANSIBLE_STRATEGY": "provisioner_mitogen_linear",
        # Jinja's compiled code kept for the next run (plugins/strategy/_template_cache.py).
        "PROVISIONER_TEMPLATE_CACHE_DIR": str(paths.cache_dir() / "jinja"),
    }


def default_strategy(playbook: str) -> str:
    """The strategy a playbook runs with when PROVISIONER_STRATEGY is unset (see MITOGEN_PLAYBOOKS)."""
    return DEFAULT_STRATEGY if playbook in MITOGEN_PLAYBOOKS else "linear"
