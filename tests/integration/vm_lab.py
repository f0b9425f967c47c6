"""What the lab VM test modules share: the CLI's JSON envelope (with Mitogen: software emulation
makes every task slow), ssh into the VM, and one VM booted for a whole module with its times."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict, Unpack

import yaml

from provisioner import lab
from provisioner.lab.image import ensure_image

BIN = Path(sys.executable).parent / "provisioner"


def cli_json(*args: str, timeout: float = 2400) -> tuple[int, dict, list[str], list[str]]:
    """Exit code, data, errors and messages of the JSON envelope."""
    env = {**os.environ, "PROVISIONER_STRATEGY": "mitogen"}
    r = subprocess.run([str(BIN), *args, "--json"], capture_output=True, text=True, timeout=timeout, env=env)
    assert r.stdout.strip(), f"no JSON on stdout; stderr: {r.stderr}"
    envelope = json.loads(r.stdout)
    assert envelope["exit_code"] == r.returncode, envelope
    return r.returncode, envelope["data"], envelope["errors"], envelope["messages"]


def ssh(server: lab.LabServer, command: str, timeout: float = 300, check: bool = True) -> str:
    """COMMAND's stdout in the VM; with check, a non-zero exit fails the test with its output."""
    r = subprocess.run(
        ["ssh", "-F", str(server.ssh_config), server.name, command],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,  # ssh makes its stdin non-blocking: killed at a timeout, it would leave it so
    )
    assert r.returncode == 0 or not check, f"{command}: {r.stdout}{r.stderr}"
    return r.stdout


class VmOptions(TypedDict, total=False):
    """lab.up_vm's options."""

    drives: int
    drive_size: str
    boot_timeout: float


@contextlib.contextmanager
def booted(name: str, times: dict[str, float], label: str, **options: Unpack[VmOptions]) -> Iterator[lab.LabServer]:
    """A lab VM for the module (lab.up_vm's options), its image built or cached first; TIMES gets
    the image's and the boot's seconds and is printed under LABEL when the VM is taken down."""
    start = time.monotonic()
    ensure_image()
    times["image (built or cached)"] = time.monotonic() - start
    start = time.monotonic()
    try:
        server = lab.up_vm(name, **options)
        times["boot to ssh"] = time.monotonic() - start
        yield server
    finally:
        lab.down(name)
        print(f"\n{label} (s): " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()))


def user_inventory(server: lab.LabServer) -> Path:
    """The VM's inventory as a user writes one for a server reached through a forwarded port:
    127.0.0.1, the port, the key and the known_hosts, and no ansible_connection (Ansible uses ssh
    there), so provisioner decides for itself that the host is not this machine. Beside the lab's own."""
    data = yaml.safe_load(server.inventory.read_text())
    host = data["all"]["children"]["lab"]["hosts"][server.name]
    host.pop("ansible_connection", None)
    assert host["ansible_host"] == "127.0.0.1" and int(host["ansible_port"]) != 22, host
    path = server.inventory.with_name("user-inventory.yml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def assert_data_array(server: lab.LabServer, level: str, drives: list[str], chunk_kb: int, data_drives: int) -> dict:
    """/dev/md/data as the storage role builds it: LEVEL on DRIVES with CHUNK_KB, XFS aligned to it
    (stripe unit = chunk, width = chunk x DATA_DRIVES, in 4 KiB blocks), mounted on /data by the
    filesystem's UUID from one fstab line, and one ARRAY line naming it in mdadm.conf.
    Returns mdadm's detail, the filesystem's UUID, the fstab line's fields and the ARRAY line."""
    detail = ssh(server, "mdadm --detail /dev/md/data")
    assert f"Raid Level : {level}" in detail and re.search(rf"Raid Devices : {len(drives)}\b", detail), detail
    assert f"Chunk Size : {chunk_kb}K" in detail, detail
    members = ssh(server, "for d in " + " ".join(drives) + "; do readlink -f $d; done").split()
    assert all(m in detail for m in members), (members, detail)
    xfs = ssh(server, "xfs_info /data")
    stripe = re.search(r"sunit=(\d+)\s+swidth=(\d+) blks", xfs)
    assert stripe, xfs
    sunit, swidth = (int(x) for x in stripe.groups())
    assert (sunit, swidth) == (chunk_kb // 4, data_drives * chunk_kb // 4), xfs
    uuid = ssh(server, "blkid -s UUID -o value /dev/md/data").strip()
    fstab = [line.split() for line in ssh(server, "cat /etc/fstab").splitlines() if "/data" in line]
    assert len(fstab) == 1 and fstab[0][0] == f"UUID={uuid}" and fstab[0][2] == "xfs", fstab
    array_uuid = re.search(r"UUID : (\S+)", detail)
    assert array_uuid, detail
    md_uuid = array_uuid.group(1)
    arrays = [line for line in ssh(server, "cat /etc/mdadm/mdadm.conf").splitlines() if line.startswith("ARRAY")]
    assert arrays == [f"ARRAY /dev/md/data metadata=1.2 UUID={md_uuid}"], arrays
    return {"detail": detail, "uuid": uuid, "fstab": fstab[0], "array": arrays[0]}
