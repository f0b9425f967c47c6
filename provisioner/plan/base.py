"""The plan's types and how it reads the facts: a :class:`Setting` (key, value, reason), the
:class:`Plan` of them, :class:`PlanError`, and the facts access every concern shares, the RAM
every memory-derived value is sized by among it (docs/tuning.md, 'Memory').  No I/O here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from provisioner.errors import BadInput

FACTS_SCHEMA = 1
GIB = 1024**3


class PlanError(BadInput):
    """Bad options or facts: refused before any host is touched (exit code 2)."""


# --------------------------------------------------------------------------
# the plan
# --------------------------------------------------------------------------


@dataclass
class Setting:
    key: str
    value: Any
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "reason": self.reason}


@dataclass
class Plan:
    settings: list[Setting] = field(default_factory=list)
    storage: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    serving: dict[str, Any] | None = None

    def value(self, key: str) -> Any:
        for setting in self.settings:
            if setting.key == key:
                return setting.value
        raise KeyError(f"no setting {key!r} in the plan; have: {', '.join(self.keys())}")

    def reason(self, key: str) -> str:
        for setting in self.settings:
            if setting.key == key:
                return setting.reason
        raise KeyError(f"no setting {key!r} in the plan")

    def keys(self) -> list[str]:
        return [s.key for s in self.settings]

    def to_dict(self) -> dict[str, Any]:
        return {
            "settings": [s.to_dict() for s in self.settings],
            "values": {s.key: s.value for s in self.settings},
            "storage": self.storage,
            "serving": self.serving,
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        return cls(
            settings=[Setting(s["key"], s["value"], s["reason"]) for s in data.get("settings", [])],
            storage=data.get("storage"),
            warnings=list(data.get("warnings", [])),
            serving=data.get("serving"),
        )


# --------------------------------------------------------------------------
# facts access
# --------------------------------------------------------------------------


def _need(facts: Mapping[str, Any], path: str) -> Any:
    node: Any = facts
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise PlanError(f"hardware facts lack {path}; gather them with the provisioner_facts module (schema {FACTS_SCHEMA})")
        node = node[part]
    return node


def _get(facts: Mapping[str, Any], path: str, default: Any = None) -> Any:
    node: Any = facts
    for part in path.split("."):
        if not isinstance(node, Mapping) or node.get(part) is None:
            return default
        node = node[part]
    return node


def check_facts(facts: Any) -> None:
    if not isinstance(facts, Mapping):
        raise PlanError("no hardware facts: run the provisioner_facts module (role plan) first")
    schema = facts.get("schema")
    if schema != FACTS_SCHEMA:
        raise PlanError(
            f"hardware facts have schema {schema!r}, this plan reads schema {FACTS_SCHEMA}; "
            "gather them again with this version's provisioner_facts"
        )


def _human_bytes(size: int) -> str:
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6)):
        if size >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size} B"


def _gib(size: float) -> str:
    return f"{size / GIB:.1f} GiB"


def _ram(facts: Mapping[str, Any]) -> Any:
    """The host's RAM as the plan sizes by it: the memory the kernel has online in its memory
    blocks where it reports them (the same from one boot to the next), else MemTotal. MemTotal
    moves with what the kernel keeps at boot, which the kernel command line changes (the 1 GiB
    pages role hugepages puts there among it), and a plan sized by it would differ after the
    reboot that applies them, so a converged host's first run after it would rewrite the plan."""
    total = _need(facts, "memory.total_bytes")
    installed = _get(facts, "memory.installed_bytes")
    if isinstance(total, int) and isinstance(installed, int) and installed >= total > 0:
        return installed
    return total


def _memory_and_hugepages(facts: Mapping[str, Any], settings: list[Setting], what: str) -> tuple[int, int]:
    """The host's RAM (_ram) and the bytes the plan's hugepages settings reserve of it; no memory
    size in the facts is refused, naming WHAT could not be sized."""
    total = _ram(facts)
    if not isinstance(total, int) or total <= 0:
        raise PlanError(f"hardware facts report no memory size; cannot size {what}")
    page_bytes = {"hugepages_2m": 2 * 1024**2, "hugepages_1g": GIB}
    return total, sum(int(st.value or 0) * page_bytes[st.key] for st in settings if st.key in page_bytes)
