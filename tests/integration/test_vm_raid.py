"""Redundant md arrays on a real kernel: one lab VM with four virtual NVMe drives, booted once for
the module (marked lab), driven through `provisioner up --tags storage` with Mitogen.

What test_vm.py does not show (it proves RAID0, the initramfs and a reboot through grub):
- RAID1 on two drives loses one (pulled from the running VM through qemu's control socket) and
  the VM reboots: it comes up (nofail, md's degraded start), the array runs on one drive with a
  file's checksum intact; up's roles keep the array as it is, change nothing and warn, its
  verify fails naming the degraded array (so up exits 1, as verify does), and status shows it
  drifted, naming the lost drive;
- the drive comes back: up re-adds it (its superblock names the array), the array rebuilds to
  clean, verify passes, and a re-run changes nothing;
- with the RAID1 stopped by hand and its drives allowed to be wiped, up builds RAID10 (near=2)
  on all four, XFS aligned to it, fstab and mdadm.conf naming only the new array, and its
  verify passes.

Times of the boot, each run, the reboot and the rebuild are printed (pytest -s).
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
from vm_lab import assert_data_array, booted, cli_json, ssh

from provisioner import lab
from provisioner.errors import ExitCode

pytestmark = pytest.mark.lab

NAME = "vm-raid"
CHUNK_KB = 64
LOST = 1  # the drive pulled out of the RAID1 (serial DATA1)
TIMES: dict[str, float] = {}


def wait_for(what: str, probe, timeout: float = 600, every: float = 3.0) -> str:
    """PROBE's output once it is not None, at most TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = probe()
        if out is not None:
            return out
        time.sleep(every)
    pytest.fail(f"{what}: not within {timeout:.0f} s")


def up(server: lab.LabServer, level: str, drives: list[str], *extra: str, key: str, verify: bool = True) -> tuple:
    start = time.monotonic()
    args = ["up", "-i", str(server.inventory), "--tags", "storage", *([] if verify else ["--no-verify"])]
    args += ["-e", f"storage_devices=[{','.join(drives)}]", "-e", "storage_backend=mdadm", "-e", f"storage_level={level}"]
    # Role common (the ML group) is not what a real kernel proves: /data goes to root's group.
    args += ["-e", f"storage_chunk_kb={CHUNK_KB}", "-e", "storage_owner_group=root", *extra]
    result = cli_json(*args)[:3]
    TIMES[key] = time.monotonic() - start
    return result


def mdstat(server: lab.LabServer) -> str:
    return ssh(server, "cat /proc/mdstat")


def clean(server: lab.LabServer) -> str | None:
    """/proc/mdstat once the data array runs on every drive with nothing to rebuild or sync."""
    text = mdstat(server)
    return text if re.search(r"\[(\d+)/\1\] \[U+\]", text) and not re.search(r"recovery|resync", text) else None


@pytest.fixture(scope="module")
def server(vm_requirements):
    with booted(NAME, TIMES, "lab VM RAID times", drives=4, drive_size="1G") as vm_server:
        yield vm_server


@pytest.fixture(scope="module")
def raid1(server):
    """RAID1 on DATA0 and DATA1, a file on it, then DATA1 pulled out and the VM rebooted."""
    pair = server.drives[:2]
    rc, _, errors = up(server, "raid1", pair, key="raid1 run", verify=False)
    assert rc == ExitCode.OK, errors
    detail = ssh(server, "mdadm --detail /dev/md/data")
    assert "Raid Level : raid1" in detail and re.search(r"Raid Devices : 2\b", detail), detail
    ssh(server, "head -c 8M /dev/urandom > /data/probe && sync")
    sha = ssh(server, "sha256sum /data/probe").split()[0]
    start = time.monotonic()
    wait_for("the new RAID1's first sync", lambda: clean(server))
    TIMES["RAID1 first sync"] = time.monotonic() - start
    assert lab.set_drive(NAME, LOST, present=False)
    wait_for("md notices the pulled drive", lambda: mdstat(server) if "[2/1]" in mdstat(server) else None, timeout=120)
    boot_id = ssh(server, "cat /proc/sys/kernel/random/boot_id").strip()
    start = time.monotonic()
    ssh(server, "systemctl reboot", check=False, timeout=60)

    def rebooted() -> str | None:
        # While the guest boots, qemu's forwarded port accepts the connection and sshd is not there
        # to answer: a probe that hangs is "not back yet", not a failure.
        try:
            r = subprocess.run(
                ["ssh", "-F", str(server.ssh_config), "-o", "ConnectTimeout=10", NAME, "cat /proc/sys/kernel/random/boot_id"],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return None
        return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() != boot_id else None

    wait_for("the VM back after the reboot", rebooted, timeout=900, every=5)
    TIMES["reboot to ssh"] = time.monotonic() - start
    # md starts an array with a member missing only after a while (mdadm-last-resort), then the
    # nofail mount follows.
    source = wait_for(
        "/data mounted after the reboot", lambda: ssh(server, "findmnt -n -o SOURCE /data", check=False) or None, 300
    )
    TIMES["reboot to the degraded mount"] = time.monotonic() - start
    return {"sha": sha, "source": source.strip()}


def test_a_raid1_that_lost_a_drive_boots_degraded_with_the_data_intact(server, raid1):
    text = mdstat(server)
    assert re.search(r"raid1 \S+\[0\]\n\s+\d+ blocks super 1.2 \[2/1\] \[U_\]", text), text
    assert re.fullmatch(r"/dev/md\d+", raid1["source"]), raid1
    assert ssh(server, "readlink -f /dev/md/data").strip() == raid1["source"]
    assert ssh(server, "sha256sum /data/probe").split()[0] == raid1["sha"]
    assert not ssh(server, f"ls {server.drives[LOST]}", check=False)


@pytest.fixture(scope="module")
def degraded_up(server, raid1):
    return up(server, "raid1", server.drives[:2], key="degraded run + verify")


def test_up_keeps_the_degraded_array_warns_and_verify_fails_naming_it(server, degraded_up):
    rc, data, errors = degraded_up
    assert data["hosts"][NAME]["failed"] == 0, errors  # the roles succeeded; the checks did not
    # Nothing to change: the declared state names the drives as storage_devices does, lost or not.
    assert data["hosts"][NAME]["changed"] == 0, data["changes"]
    warnings = data["hosts"][NAME]["warnings"]
    lost = server.drives[LOST]
    assert any(
        w.startswith("storage: the data array /dev/md/data (raid1) runs degraded on 1 of 2 drives") and lost in w
        for w in warnings
    ), warnings
    assert rc == ExitCode.HOST_FAILED, errors
    storage = data["verify"]["roles"][NAME]["storage"]
    assert storage["outcome"] == "failed", storage
    line = " ".join(storage["details"])
    assert "the data array /dev/md/data" in line and "runs degraded on 1 of 2 drives" in line and lost in line, line
    assert "put the drive back" in line, line
    assert ssh(server, "mdadm --detail /dev/md/data | grep -c 'Raid Level : raid1'").strip() == "1"


def test_status_shows_the_degraded_array_drifted(server, degraded_up):
    row = _status(server, "status (degraded)")
    assert row["state"] == "drifted" and "degraded" in json.dumps(row), row
    assert f"{server.drives[LOST]} missing" in json.dumps(row), row  # the lost drive, by its stable name


def _status(server: lab.LabServer, key: str) -> dict:
    """The data array's row of `provisioner status`."""
    start = time.monotonic()
    _, data, errors, _ = cli_json("status", "-i", str(server.inventory))
    TIMES[key] = time.monotonic() - start
    rows = list(_named(data, "data array"))
    assert len(rows) == 1, (data, errors)
    return rows[0]


def _named(data, name: str):
    """Every dict in DATA (nested) whose name is NAME."""
    if isinstance(data, dict):
        if data.get("name") == name:
            yield data
        for value in data.values():
            yield from _named(value, name)
    elif isinstance(data, list):
        for value in data:
            yield from _named(value, name)


@pytest.fixture(scope="module")
def repaired(server, degraded_up):
    assert lab.set_drive(NAME, LOST, present=True)
    wait_for("the drive back in the VM", lambda: ssh(server, f"ls {server.drives[LOST]}", check=False) or None, 120)
    result = up(server, "raid1", server.drives[:2], key="repair run", verify=False)
    during = mdstat(server)
    start = time.monotonic()
    wait_for("the RAID1 rebuilt", lambda: clean(server))
    TIMES["rebuild to clean"] = time.monotonic() - start
    again = up(server, "raid1", server.drives[:2], key="re-run + verify")
    return result, during, again


def test_the_returning_drive_is_re_added_and_the_array_rebuilds_to_clean(server, repaired):
    (rc, data, errors), during, _ = repaired
    assert rc == ExitCode.OK, errors
    assert data["hosts"][NAME]["changed"] > 0 and data["hosts"][NAME]["warnings"] == []
    assert "[2/2] [UU]" in during or "recovery" in during, during
    member = ssh(server, f"readlink -f {server.drives[LOST]}").strip().rsplit("/", 1)[-1]
    assert re.search(rf"\b{member}\[\d+\]", mdstat(server)), mdstat(server)
    # Rebuilt: nothing degraded or recovering ("active" while writes are in flight, else "clean").
    detail = ssh(server, "mdadm --detail /dev/md/data")
    found = re.search(r"State : (.+)", detail)
    assert found, detail
    state = found.group(1).strip()
    assert state in ("clean", "active"), state
    assert ssh(server, "sha256sum /data/probe").split()[0]


def test_once_clean_verify_passes_status_is_ok_and_a_re_run_changes_nothing(server, repaired):
    _, _, (rc, data, errors) = repaired
    assert rc == ExitCode.OK, errors
    assert data["hosts"][NAME]["changed"] == 0, data["changes"]
    assert data["verify"]["roles"][NAME]["storage"]["outcome"] == "passed", data["verify"]
    row = _status(server, "status (clean)")
    assert row["state"] == "ok", row


@pytest.fixture(scope="module")
def raid10(server, repaired):
    old_uuid = ssh(server, "blkid -s UUID -o value /dev/md/data").strip()
    ssh(server, "umount /data && mdadm --stop /dev/md/data")
    wipe = ["-e", f"storage_wipe_devices=[{','.join(server.drives[:2])}]"]
    # Its verify is the run's own; that a re-run of a built array changes nothing is the RAID1's
    # above (and test_vm.py's RAID0), not repeated here at a minute and more a run under emulation.
    return up(server, "raid10", server.drives, *wipe, key="RAID10 run + verify"), old_uuid


def test_raid10_replaces_the_stopped_raid1_when_its_drives_may_be_wiped(server, raid10):
    (rc, data, errors), old_uuid = raid10
    assert rc == ExitCode.OK, errors
    array = assert_data_array(server, "raid10", server.drives, CHUNK_KB, data_drives=2)
    assert "Layout : near=2" in array["detail"], array["detail"]
    assert array["uuid"] != old_uuid
    assert data["verify"]["roles"][NAME]["storage"]["outcome"] == "passed", data["verify"]
