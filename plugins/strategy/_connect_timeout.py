"""The connection timeout under Mitogen means what it means under Ansible's ssh connection.

Ansible's ssh connection hands its timeout (a host's `ansible_timeout`, else the run's
--connect-timeout) to ssh as ConnectTimeout: how long the host may take to answer, the TCP
connection and ssh's greeting. Mitogen takes the same number as the deadline of its whole start
on the host: ssh's login, a Python started there and Mitogen's bootstrap sent to it. On a host
that answers at once but starts slowly (a busy server, or a busy control node starting many
connections at once) that start took longer than the default 10 s, and a live host was
reported unreachable.

adjust() gives ssh the host's timeout as ConnectTimeout, as Ansible's connection does, and
Mitogen's start START_SECONDS more on top: a host that does not answer is still reported after
the timeout (ssh gives up then), one that answers has the time its start needs. The strategy
puts it on Mitogen's ssh connection methods with _host_keys.wrap_methods.
"""

from __future__ import annotations

from typing import Any

# Mitogen's own deadline for a start when it is given none.
START_SECONDS = 30


def adjust(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Mitogen's ssh connection arguments (`_connect_ssh`'s kwargs) with the timeout split as above."""
    timeout = kwargs.get("connect_timeout")
    if not timeout:
        return kwargs
    seconds = max(1, int(float(timeout)))
    # Ahead of every other argument: ssh keeps the first ConnectTimeout it reads.
    args = ["-o", f"ConnectTimeout={seconds}", *(kwargs.get("ssh_args") or [])]
    return dict(kwargs, ssh_args=args, connect_timeout=seconds + START_SECONDS)
