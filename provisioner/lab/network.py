"""A lab server on the network: one /24 of LAB_NET per server (host side .1, server .2) on
its nspawn veth, and, while any server is up, ip_forward on and one MASQUERADE rule (the
host's ip_forward is saved before the first server and restored after the last)."""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from provisioner import paths
from provisioner.system import run

from .common import LabError, write_file
from .processes import START_TIMEOUT_S

LAB_NET = ipaddress.IPv4Network("10.213.0.0/16")
NAT_COMMENT = "provisioner-lab"
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


def subnet(index: int) -> tuple[str, str]:
    """(host side, server side) addresses of lab subnet INDEX."""
    base = int(LAB_NET.network_address) + (index << 8)
    return str(ipaddress.IPv4Address(base + 1)), str(ipaddress.IPv4Address(base + 2))


def lab_indexes(ip_addr_output: str) -> set[int]:
    """The lab subnets named in the output of `ip -o -4 addr show`."""
    return {int(match.group(2)) for match in re.finditer(r"inet (10\.213\.(\d+)\.\d+)/", ip_addr_output)}


def host_lab_indexes() -> set[int]:
    """Lab subnets in use on this host's interfaces (any lab dir)."""
    return lab_indexes(run(["ip", "-o", "-4", "addr", "show"], "listing host addresses failed", error=LabError).stdout)


def free_index(used: Iterable[int]) -> int:
    """The lowest lab subnet (1-254) not in USED."""
    taken = set(used)
    for index in range(1, 255):
        if index not in taken:
            return index
    raise LabError("all 254 lab subnets are in use: take some lab servers down (provisioner lab down NAME)")


def allocate_index(states: Iterable[dict[str, Any]]) -> int:
    """A subnet free on this host's interfaces and in every server state (STATES) of the lab dir."""
    used = host_lab_indexes()
    for state in states:
        if state.get("kind") == "vm":
            continue  # VMs use user-mode networking, no lab subnet
        with contextlib.suppress(KeyError, ValueError):
            used.add(int(state["address"].split(".")[2]))
    return free_index(used)


def peer_veth(leader_pid: int, console: Path) -> str:
    """Host-side veth name: host0's peer ifindex, read inside the server's netns."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        proc = run(
            ["nsenter", "-t", str(leader_pid), "-n", "ip", "-o", "link", "show", "dev", "host0"],
            "reading the lab server's veth failed",
            error=LabError,
            check=False,
        )
        match = re.search(r"host0@if(\d+)", proc.stdout)
        if match:
            with contextlib.suppress(OSError):
                return socket.if_indextoname(int(match.group(1)))
        time.sleep(0.02)
    raise LabError(f"no host0 veth in the lab server after {START_TIMEOUT_S:.0f} s: see {console}")


def address_veth(leader_pid: int, veth: str, host_ip: str, server_ip: str) -> None:
    """Both ends of the veth up and addressed; the server's default route via the host."""
    what = "addressing the lab veth failed"
    inside = ["nsenter", "-t", str(leader_pid), "-n", "ip"]
    for cmd in (
        ["ip", "addr", "add", f"{host_ip}/24", "dev", veth],
        ["ip", "link", "set", veth, "up"],
        [*inside, "link", "set", "lo", "up"],
        [*inside, "addr", "add", f"{server_ip}/24", "dev", "host0"],
        [*inside, "link", "set", "host0", "up"],
        [*inside, "route", "replace", "default", "via", host_ip],
    ):
        run(cmd, what, error=LabError)


def nat_rule() -> list[str]:
    """The MASQUERADE rule (chain and match, for iptables -t nat -A/-C/-D) for traffic leaving LAB_NET."""
    lab = str(LAB_NET)
    return ["POSTROUTING", "-s", lab, "!", "-d", lab, "-m", "comment", "--comment", NAT_COMMENT, "-j", "MASQUERADE"]


def _nat_present() -> bool:
    cmd = ["iptables", "-w", "-t", "nat", "-C", *nat_rule()]
    return run(cmd, "checking the lab NAT rule failed", error=LabError, check=False).returncode == 0


def _saved_forward() -> Path:
    return paths.lab_dir() / "ip_forward.saved"


def enable_host_network() -> None:
    """ip_forward on (previous value remembered) and the one MASQUERADE rule."""
    saved = _saved_forward()
    if not saved.is_file():
        write_file(saved, IP_FORWARD.read_text())
    IP_FORWARD.write_text("1\n")
    if not _nat_present():
        run(
            ["iptables", "-w", "-t", "nat", "-A", *nat_rule()],
            "adding the lab NAT rule failed",
            "check that iptables works here",
            error=LabError,
        )


def release_host_network_if_idle() -> None:
    """With no lab subnet left on this host: NAT rule out, ip_forward restored."""
    if host_lab_indexes():
        return
    while _nat_present():
        run(["iptables", "-w", "-t", "nat", "-D", *nat_rule()], "removing the lab NAT rule failed", error=LabError)
    saved = _saved_forward()
    if saved.is_file():
        IP_FORWARD.write_text(saved.read_text())
        saved.unlink()


def delete_link(veth: str) -> None:
    """The veth goes with the netns; delete a leftover (kernel cleanup is asynchronous)."""
    if veth and Path(f"/sys/class/net/{veth}").exists():
        run(["ip", "link", "del", veth], f"deleting the lab veth {veth} failed", error=LabError, check=False)
