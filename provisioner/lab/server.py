"""A lab server's life: `up` (create, or return the running one), `down`, and the lab lock
that serializes them; composed from the rootfs, mounts, ssh, processes, network and state."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from provisioner import paths
from provisioner.system import locked

from . import network, processes
from .common import LabError, check_environment
from .mounts import check_devices, is_mounted, mount_overlay, umount
from .rootfs import ensure_rootfs
from .ssh import lab_key, prepare_overlay, write_client_files
from .state import LabServer, all_states, read_state, server_dir, server_from_state, validate_name, write_state


def frozen() -> contextlib.AbstractContextManager[None]:
    """Hold the lab lock: no server comes up or goes down meanwhile (for consistent checks)."""
    return locked(paths.lab_dir() / ".lock")


def _create(name: str, devices: list[str], rootfs: Path) -> LabServer:
    root = server_dir(name)
    root.mkdir(parents=True)
    root.chmod(0o700)
    key = lab_key()
    host_ip, address = network.subnet(network.allocate_index(all_states()))
    state: dict[str, Any] = {"name": name, "address": address, "root": str(root), "devices": devices}
    write_state(name, state)
    merged = mount_overlay(rootfs, root)
    host_key = prepare_overlay(merged, name, key.with_name(key.name + ".pub").read_text())
    write_client_files(root, name, address, key, host_key)
    console = root / "console.log"
    state["pid"] = processes.spawn(merged, name, devices, console)
    write_state(name, state)
    state["leader_pid"] = processes.wait_leader(state["pid"], console)
    state["host_veth"] = network.peer_veth(state["leader_pid"], console)
    write_state(name, state)
    network.enable_host_network()
    network.address_veth(state["leader_pid"], state["host_veth"], host_ip, address)
    processes.wait_ssh(address, state["pid"], name, console)
    server = LabServer(
        name=name,
        address=address,
        pid=state["pid"],
        leader_pid=state["leader_pid"],
        root=root,
        ssh_key=key,
        known_hosts=root / "known_hosts",
        inventory=root / "inventory.yml",
        ssh_config=root / "ssh_config",
        host_veth=state["host_veth"],
        devices=devices,
        alive=True,
    )
    write_state(name, server.to_dict(), indent=2)
    return server


def _teardown(name: str, graceful: bool = True) -> bool:
    """Stop, unmount and delete whatever exists of NAME (also half-made servers).

    graceful=False kills at once: for servers that are thrown away unbooted or dead.
    """
    root = server_dir(name)
    if not root.exists():
        return False
    state = read_state(name)
    processes.stop(int(state.get("pid") or 0), int(state.get("leader_pid") or 0), name, graceful)
    network.delete_link(state.get("host_veth", ""))
    merged = root / "merged"
    processes.remove_nspawn_leftovers(name, merged)
    umount(merged)
    if is_mounted(merged):
        raise LabError(f"{merged} is still mounted: unmount it by hand, then run lab down {name} again")
    _discard(root)
    return True


def discarded_dir() -> Path:
    return paths.lab_dir() / ".discarded"


def _discard(root: Path) -> None:
    """Move ROOT aside at once and delete it in the background.

    The name is free again immediately; the deletion (an ML environment is tens of thousands
    of files: 37 s here for 1.2 GB, nearly all of it waiting on the disk) runs in a detached
    `rm`, which also sweeps what an interrupted earlier one left in discarded_dir().
    """
    trash = discarded_dir()
    trash.mkdir(mode=0o700, exist_ok=True)
    target = trash / f"{root.name}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(root, target)
    except OSError as exc:
        raise LabError(f"cannot move {root} aside ({exc}): delete it by hand") from exc
    leftovers = [str(p) for p in trash.iterdir()]
    try:
        subprocess.Popen(
            ["rm", "-rf", "--one-file-system", "--", *leftovers],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        shutil.rmtree(target, ignore_errors=True)


def _failed_console(name: str) -> Path:
    return paths.lab_dir() / f"{name}.failed-console.log"


def _keep_console(name: str) -> Path | None:
    """Keep the console log of a failed up (its server dir is deleted)."""
    console = server_dir(name) / "console.log"
    if not console.is_file():
        return None
    with contextlib.suppress(OSError):
        shutil.copyfile(console, _failed_console(name))
        return _failed_console(name)
    return None


def up(name: str, *, devices: Sequence[str] = ()) -> LabServer:
    """Boot lab server NAME, or return it unchanged if it is running (devices included).

    A stale NAME (its nspawn process died, or an earlier up failed half way) is torn
    down and created again. Any failure tears down what this call made.
    """
    validate_name(name)
    check_environment()
    checked = check_devices(devices)
    rootfs = ensure_rootfs()
    with frozen():
        existing = server_from_state(read_state(name))
        if existing is not None and existing.alive:
            return existing
        _teardown(name, graceful=False)
        _failed_console(name).unlink(missing_ok=True)
        try:
            return _create(name, checked, rootfs)
        except BaseException as exc:
            kept = _keep_console(name)
            with contextlib.suppress(Exception):
                _teardown(name, graceful=False)
                network.release_host_network_if_idle()
            if isinstance(exc, LabError) and kept:
                console = str(server_dir(name) / "console.log")
                raise LabError(str(exc).replace(console, str(kept))) from exc
            raise


def down(name: str) -> bool:
    """Tear lab server NAME down; True if something was torn down."""
    validate_name(name)
    check_environment()
    with frozen():
        removed = _teardown(name)
        _failed_console(name).unlink(missing_ok=True)
        network.release_host_network_if_idle()
    return removed
