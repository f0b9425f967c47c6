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
from provisioner.errors import ExitCode
from provisioner.system import locked

from . import cpu, network, processes, vm
from .common import LabError, check_environment, write_file
from .image import ensure_image
from .mounts import check_devices, is_mounted, mount_overlay, umount
from .rootfs import ensure_rootfs
from .ssh import lab_key, new_host_key, prepare_overlay, write_client_files
from .state import LabServer, all_states, read_state, server_dir, server_from_state, validate_name, write_state


def frozen() -> contextlib.AbstractContextManager[None]:
    """Hold the lab lock: no server comes up or goes down meanwhile (for consistent checks)."""
    return locked(paths.lab_dir() / ".lock")


def _create(name: str, devices: list[str], rootfs: Path, fresh: bool = False, cpu_weight: int | None = None) -> LabServer:
    root = server_dir(name)
    root.mkdir(parents=True)
    root.chmod(0o700)
    key = lab_key()
    host_ip, address = network.subnet(network.allocate_index(all_states()))
    state: dict[str, Any] = {
        "name": name,
        "address": address,
        "root": str(root),
        "devices": devices,
        "fresh": fresh,
        "cpu_weight": cpu_weight,
    }
    write_state(name, state)
    merged = mount_overlay(rootfs, root)
    host_key = prepare_overlay(merged, name, key.with_name(key.name + ".pub").read_text(), fresh)
    write_client_files(root, name, address, key, host_key, fresh=fresh)
    console = root / "console.log"
    procs = cpu.create(name, cpu_weight) if cpu_weight is not None else None
    state["pid"] = processes.spawn(merged, name, devices, console, procs)
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
        fresh=fresh,
        cpu_weight=cpu_weight,
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
    if state.get("kind") == "vm":
        vm.stop(int(state.get("pid") or 0), name)
        _discard(root)
        return True
    processes.stop(int(state.get("pid") or 0), int(state.get("leader_pid") or 0), name, graceful)
    try:
        cpu.remove(name)  # what is left in its cpu cgroup killed, then the group (a failure said after the rest)
    finally:
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


def up(name: str, *, devices: Sequence[str] = (), fresh: bool = False, cpu_weight: int | None = None) -> LabServer:
    """Boot lab server NAME, or return it unchanged if it is running (devices included).

    FRESH: from the fresh-install rootfs (no python3-apt, no /etc/hosts) with an empty
    known_hosts in its inventory, as a new server meets a control node that never saw it.
    CPU_WEIGHT: its processes run in a cpu cgroup of their own with this weight (provisioner.lab.cpu;
    100 weighs as any session of this machine). A running NAME of another flavour or weight is refused.
    A stale NAME (its nspawn process died, or an earlier up failed half way) is torn
    down and created again. Any failure tears down what this call made.
    """
    validate_name(name)
    if cpu_weight is not None and (problem := cpu.weight_problem(cpu_weight)):
        raise LabError(f"CPU weight {cpu_weight}: {problem}")
    check_environment()
    checked = check_devices(devices)
    rootfs = ensure_rootfs(fresh)
    with frozen():
        existing = server_from_state(read_state(name))
        if existing is not None and existing.alive:
            if existing.kind == "container" and existing.fresh != fresh:
                was, asked = ("fresh", "lab") if existing.fresh else ("lab", "fresh")
                raise LabError(
                    f"lab server {name} runs as a {was} server, not a {asked} one: take it down first (lab down {name})"
                )
            if existing.kind == "container" and existing.cpu_weight != cpu_weight:
                was = f"CPU weight {existing.cpu_weight}" if existing.cpu_weight is not None else "no CPU weight"
                asked = f"CPU weight {cpu_weight}" if cpu_weight is not None else "none"
                raise LabError(f"lab server {name} runs with {was}, not {asked}: take it down first (lab down {name})")
            return existing
        _teardown(name, graceful=False)
        _failed_console(name).unlink(missing_ok=True)
        try:
            return _create(name, checked, rootfs, fresh=fresh, cpu_weight=cpu_weight)
        except BaseException as exc:
            kept = _keep_console(name)
            with contextlib.suppress(Exception):
                _teardown(name, graceful=False)
                network.release_host_network_if_idle()
            if isinstance(exc, LabError) and kept:
                console = str(server_dir(name) / "console.log")
                raise LabError(str(exc).replace(console, str(kept))) from exc
            raise


def _plan_vm(name: str, drive_count: int, drive_size: str) -> list[vm.Drive]:
    """The drives of VM NAME, refused before anything starts when this machine cannot hold the VM."""
    lab = paths.lab_dir()
    lab.mkdir(parents=True, exist_ok=True)
    drives = vm.plan_drives(server_dir(name), drive_count, drive_size, shutil.disk_usage(lab).free)
    vm.check_memory(Path("/proc/meminfo").read_text())
    return drives


def _create_vm(name: str, drives: list[vm.Drive], accel: str, base: Path, boot_timeout: float) -> LabServer:
    root = server_dir(name)
    with frozen():
        used = [int(s.get("port") or 0) for s in all_states() if s.get("kind") == "vm"]
        port = vm.free_port(used)
        root.mkdir(parents=True)
        root.chmod(0o700)
        key = lab_key()
        state: dict[str, Any] = {
            "name": name,
            "kind": "vm",
            "accel": accel,
            "address": "127.0.0.1",
            "port": port,
            "root": str(root),
            "drives": [d.by_id for d in drives],
            "booting": True,
        }
        write_state(name, state)
        seed = root / "seed"
        host_key = new_host_key(seed, name)
        write_file(seed / "hostname", name + "\n")
        shutil.copyfile(key.with_name(key.name + ".pub"), seed / "authorized_keys")
        write_client_files(root, name, "127.0.0.1", key, host_key, port)
        vm.create_disk(base, root / "disk.qcow2")
        vm.create_drives(drives)
        fw_cfg = {
            "hostname": str(seed / "hostname"),
            "host_key": str(seed / "ssh_host_ed25519_key"),
            "host_key.pub": str(seed / "ssh_host_ed25519_key.pub"),
            "authorized_keys": str(seed / "authorized_keys"),
        }
        console = root / "console.log"
        cmd = vm.qemu_cmd(name, root / "disk.qcow2", console, port, drives, accel, fw_cfg)
        state["pid"] = vm.remember(vm.spawn(cmd, console, root / "qemu.log"))
        write_state(name, state)
    # Booting takes a minute or more under emulation: other servers come and go meanwhile.
    vm.wait_ssh(name, state["pid"], port, console, boot_timeout)
    server = LabServer(
        name=name,
        address="127.0.0.1",
        pid=state["pid"],
        leader_pid=0,
        root=root,
        ssh_key=key,
        known_hosts=root / "known_hosts",
        inventory=root / "inventory.yml",
        ssh_config=root / "ssh_config",
        host_veth="",
        alive=True,
        kind="vm",
        accel=accel,
        port=port,
        drives=[d.by_id for d in drives],
    )
    with frozen():
        write_state(name, server.to_dict(), indent=2)
    return server


def up_vm(
    name: str,
    *,
    drives: int = 0,
    drive_size: str = vm.DEFAULT_DRIVE_SIZE,
    boot_timeout: float = vm.BOOT_TIMEOUT_S,
) -> LabServer:
    """Boot lab VM NAME (qemu, its own kernel, DRIVES NVMe drives of DRIVE_SIZE), or return it if it runs.

    Bad input (too many or too large drives, too little memory, qemu missing) is refused before
    anything starts. A VM that does not answer ssh within BOOT_TIMEOUT is stopped and removed,
    the console's last lines in the error.
    """
    validate_name(name)
    check_environment()
    vm.check_vm_environment()
    existing = server_from_state(read_state(name))
    if existing is not None and existing.alive:
        if existing.kind != "vm":
            raise LabError(f"lab server {name} is a container: take it down first (lab down {name})")
        return existing
    planned = _plan_vm(name, drives, drive_size)
    base = ensure_image()  # first: the image build probes the accelerator with the guest's kernel
    accel = vm.accelerator()
    with frozen():
        _teardown(name, graceful=False)
        _failed_console(name).unlink(missing_ok=True)
    try:
        return _create_vm(name, planned, accel, base, boot_timeout)
    except BaseException as exc:
        kept = _keep_console(name)
        with contextlib.suppress(Exception), frozen():
            _teardown(name, graceful=False)
        if isinstance(exc, LabError) and kept:
            raise LabError(f"{exc} (console log: {kept})") from exc
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


def set_drive(name: str, index: int, present: bool) -> bool:
    """Take drive INDEX of running lab VM NAME out (PRESENT false) or put it back (true).

    True if that changed anything. Refused (LabError) for a server that is not a running VM or
    a drive it never had.
    """
    validate_name(name)
    server = server_from_state(read_state(name))
    if server is None or server.kind != "vm" or not server.alive:
        raise LabError(f"lab VM {name} is not running: start it with lab up {name} --vm --drives N", ExitCode.BAD_INPUT)
    if not 0 <= index < len(server.drives):
        raise LabError(
            f"lab VM {name} has {len(server.drives)} drive(s), numbered 0 to {len(server.drives) - 1}; there is no drive {index}",
            ExitCode.BAD_INPUT,
        )
    serial = server.drives[index].removeprefix(vm.BY_ID_PREFIX)
    drive = vm.Drive(server.root / f"nvme{index}.qcow2", serial, 0)
    if present:
        return vm.return_drive(server.root, drive, index)
    return vm.remove_drive(server.root, index)
