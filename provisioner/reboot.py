"""Which hosts to reboot after a run: a pure decision, from the reasons the roles reported.

Roles never reboot; they append one-line reasons to the fact provisioner_reboot_reasons.
A host is rebooted once, only when the user allowed it, and never when it is the machine
provisioner runs on (the local connection, or ssh to its own sshd on a loopback address).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

REASONS_FACT = "provisioner_reboot_reasons"
# The names Ansible gives its implicit localhost (ansible.constants.LOCALHOST).
_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}
# The local connection plugin by its short and its full name, and Mitogen's for it.
_LOCAL_CONNECTIONS = {"local", "ansible.builtin.local", "mitogen_local"}
# ssh by its names (ansible.builtin.ssh, paramiko_ssh, Mitogen's): its address and port decide.
_SSH_CONNECTIONS = {"ssh", "paramiko", "paramiko_ssh", "mitogen_ssh", "smart"}


@dataclass
class RebootDecision:
    reboot: dict[str, list[str]] = field(default_factory=dict)  # host -> reasons: reboot now
    pending: dict[str, list[str]] = field(default_factory=dict)  # host -> reasons: left to the user

    def to_dict(self) -> dict[str, Any]:
        return {"reboot": self.reboot, "pending": self.pending}


def is_local(host: str, hostvars: Mapping[str, Any], in_inventory: bool = True) -> bool:
    """Whether HOST is the machine provisioner runs on. The connection decides: the local one is
    this machine; ssh reaches another machine, unless it goes to this machine's own sshd (a
    loopback address on ssh's port). A host at 127.0.0.1 on another port is forwarded or
    tunnelled (a lab VM): another machine, rebooted like any. A host named localhost, 127.0.0.1 or
    ::1 that the inventory does not hold is Ansible's implicit localhost, which is local."""
    conn = hostvars.get("ansible_connection")
    if conn is None and not in_inventory:
        return host in _LOCAL_NAMES
    if conn is not None and conn in _LOCAL_CONNECTIONS:
        return True
    if conn is not None and str(conn).rsplit(".", 1)[-1] not in _SSH_CONNECTIONS:
        return False  # another transport (e.g. a container's): not this machine
    address = str(hostvars.get("ansible_host") or hostvars.get("ansible_ssh_host") or host)
    port = str(hostvars.get("ansible_port") or hostvars.get("ansible_ssh_port") or 22)
    return _is_loopback(address) and port == "22"


def _is_loopback(address: str) -> bool:
    if address.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


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
        if allow_reboot and not is_local(host, hostvars.get(host, {}), in_inventory=host in hostvars):
            decision.reboot[host] = reasons
        else:
            decision.pending[host] = reasons
    return decision
