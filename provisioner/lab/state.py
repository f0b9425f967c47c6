"""What the lab dir remembers of each server: LAB_DIR/NAME/state.json, read back as a
LabServer (also for a half-made server), and the listing of every server."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from provisioner import paths

from .common import LabError, write_file
from .processes import is_our_nspawn
from .vm import is_our_qemu

NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,30}")


def validate_name(name: str) -> None:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise LabError(f"bad lab server name {name!r}: use 1-31 characters, a-z, 0-9 and '-', starting with a letter")


@dataclass
class LabServer:
    name: str
    address: str
    pid: int
    leader_pid: int
    root: Path
    ssh_key: Path
    known_hosts: Path
    inventory: Path
    ssh_config: Path
    host_veth: str
    devices: list[str] = field(default_factory=list)
    alive: bool = False
    # "container" (systemd-nspawn) or "vm" (qemu, reached at 127.0.0.1:port); accel: kvm or tcg.
    kind: str = "container"
    accel: str = ""
    port: int = 22
    # A VM's NVMe drives as the guest names them (/dev/disk/by-id/...).
    drives: list[str] = field(default_factory=list)
    # Booted from the fresh-install rootfs, its inventory's known_hosts empty (lab up --fresh).
    fresh: bool = False
    # The weight of its cpu cgroup (lab up --cpu-weight); None: no cgroup of its own.
    cpu_weight: int | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, Path):
                data[key] = str(value)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LabServer:
        """The server a state holds; a half-made server (up failed or was killed) lacks some
        fields, which take their defaults. Raises KeyError without a name, TypeError on a bad value."""

        def path(key: str, default: Path) -> Path:
            return Path(data[key]) if key in data else default

        name = data["name"]
        root = path("root", paths.lab_dir() / name)
        return cls(
            name=name,
            address=data.get("address", ""),
            pid=data.get("pid", 0),
            leader_pid=data.get("leader_pid", 0),
            root=root,
            ssh_key=path("ssh_key", paths.lab_dir() / "id_ed25519"),
            known_hosts=path("known_hosts", root / "known_hosts"),
            inventory=path("inventory", root / "inventory.yml"),
            ssh_config=path("ssh_config", root / "ssh_config"),
            host_veth=data.get("host_veth", ""),
            devices=list(data.get("devices") or []),
            alive=data.get("alive", False),
            kind=data.get("kind", "container"),
            accel=data.get("accel", ""),
            port=data.get("port", 22),
            drives=list(data.get("drives") or []),
            fresh=bool(data.get("fresh", False)),
            cpu_weight=data.get("cpu_weight"),
        )


def server_dir(name: str) -> Path:
    return paths.lab_dir() / name


def state_file(name: str) -> Path:
    return server_dir(name) / "state.json"


def read_state(name: str) -> dict[str, Any]:
    """Server NAME's state, {} if it has none (or an unreadable one)."""
    try:
        state = json.loads(state_file(name).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def write_state(name: str, state: dict[str, Any], indent: int | None = None) -> None:
    write_file(state_file(name), json.dumps(state, indent=indent))


def all_states() -> list[dict[str, Any]]:
    """The state of every server in the lab dir that has one, by name."""
    lab = paths.lab_dir()
    if not lab.is_dir():
        return []
    return [s for d in sorted(lab.iterdir()) if d.is_dir() and (s := read_state(d.name))]


def server_from_state(state: dict[str, Any]) -> LabServer | None:
    """The server in STATE with `alive` found out now; None if STATE holds none."""
    try:
        server = LabServer.from_dict(state)
    except (TypeError, KeyError):
        return None
    if server.kind == "vm":
        server.alive = is_our_qemu(server.pid, server.name) and not state.get("booting", False)
    else:
        server.alive = is_our_nspawn(server.pid, server.name)
    return server


def list_servers() -> list[LabServer]:
    """Every lab server in lab_dir(), alive or not (see .alive)."""
    servers = [server_from_state(state) for state in all_states()]
    return [s for s in servers if s is not None]
