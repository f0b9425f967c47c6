"""Role and plan options given on the command line, checked against the roles' argument specs."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

import yaml

from . import paths
from .errors import BadInput

# Roles whose options are arguments other roles pass on include, never a user's -e.
INTERNAL_ROLES = frozenset({"shared"})


def _documented() -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(role, option, spec) for every option a role documents in meta/argument_specs.yml."""
    for spec in sorted(paths.ROLES.glob("*/meta/argument_specs.yml")):
        if spec.parent.parent.name in INTERNAL_ROLES:
            continue
        data = yaml.safe_load(spec.read_text()) or {}
        for entry in (data.get("argument_specs") or {}).values():
            for name, option in ((entry or {}).get("options") or {}).items():
                yield spec.parent.parent.name, name, option or {}


def option_specs() -> dict[str, dict[str, Any]]:
    """Every documented option's spec (type, choices, elements), by name."""
    return {name: option for _, name, option in _documented()}


def check_choices(key: str, value: Any, spec: dict[str, Any]) -> None:
    """Refuse a value outside the option's documented choices (a list: each element)."""
    choices = spec.get("choices")
    if not choices or value is None:
        return
    values = value if spec.get("type") == "list" and isinstance(value, list) else [value]
    wrong = [v for v in values if v not in choices]
    if wrong:
        raise BadInput(f"-e {key}: {', '.join(map(str, wrong))} is not one of {', '.join(map(str, choices))}")


def known_options() -> dict[str, str]:
    """Every option any role documents in meta/argument_specs.yml, with its role's name."""
    return {name: role for role, name, _ in _documented()}


def parse_extra_vars(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs (VALUE read as YAML) for documented role options only."""
    known = known_options()
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise BadInput(f"-e {pair!r} is not KEY=VALUE: write it like -e plan_trials=8")
        if key not in known:
            close = difflib.get_close_matches(key, known, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "see the roles' meta/argument_specs.yml"
            raise BadInput(f"unknown option {key!r}: {hint}")
        try:
            out[key] = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise BadInput(f"-e {key}: value {raw!r} is not valid YAML ({problem})") from exc
    specs = option_specs() if out else {}
    for key, value in out.items():
        check_choices(key, value, specs.get(key, {}))
        check_type(key, value, specs.get(key, {}), known[key])
    return out


def check_type(key: str, value: Any, spec: dict[str, Any], role: str) -> None:
    """Refuse, on the control node, a value of the wrong type, as the role's argument spec check
    on the host would after connecting (the same Ansible validator: what passes here may still
    be refused there for what only the host knows, never the other way round)."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    wanted = {k: v for k, v in spec.items() if k in ("type", "elements")}
    if not wanted or value is None:
        return
    errors = ArgumentSpecValidator({key: wanted}).validate({key: value}).error_messages
    if errors:
        why = str(errors[0]).split(": ", 1)[-1]
        raise BadInput(
            f"-e {key}: {value!r} is not a valid {spec.get('type')}"
            + (f" of {spec['elements']}" if spec.get("elements") else "")
            + f" ({why}); see roles/{role}/meta/argument_specs.yml"
        )
