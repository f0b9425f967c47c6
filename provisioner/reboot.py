"""Which hosts to reboot after a run: a pure decision, from the reasons the roles reported.

Roles never reboot; they append one-line reasons to the fact provisioner_reboot_reasons.
A host is rebooted once, only when the user allowed it, and never when it is the machine
provisioner runs on (a local connection).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

REASONS_FACT = "provisioner_reboot_reasons"
_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}


@dataclass
class RebootDecision:
    reboot: dict[str, list[str]] = field(default_factory=dict)  # host -> reasons: reboot now
    pending: dict[str, list[str]] = field(default_factory=dict)  # host -> reasons: left to the user

    def to_dict(self) -> dict[str, Any]:
        return {"reboot": self.reboot, "pending": self.pending}


def is_local(host: str, hostvars: Mapping[str, Any]) -> bool:
    conn = hostvars.get("ansible_connection")
    return conn == "local" or (conn is None and (hostvars.get("ansible_host") or host) in _LOCAL_NAMES)


def decide(
    facts: Mapping[str, Mapping[str, Any]],
    hostvars: Mapping[str, Mapping[str, Any]],
    allow_reboot: bool,
) -> RebootDecision:
    decision = RebootDecision()
    for host, host_facts in facts.items():
        reasons = list(dict.fromkeys(host_facts.get(REASONS_FACT) or []))
        if not reasons:
            continue
        if allow_reboot and not is_local(host, hostvars.get(host, {})):
            decision.reboot[host] = reasons
        else:
            decision.pending[host] = reasons
    return decision
