"""The data array as `provisioner status` and the hourly drift check see it: degraded is drift,
rebuilding the lost member (recovery) is not, and a failed member stays drift while it rebuilds
another."""

from __future__ import annotations

from pathlib import Path

from status_modules import kernel
from status_modules import probes as probing

CHECK = {"name": "data array", "probe": "md", "device": "/dev/md/data", "expected": "active, not degraded",
         "members": ["nvme0n1", "nvme1n1"]}

DEGRADED = """Personalities : [raid1]
md127 : active raid1 nvme0n1[0]
      1046528 blocks super 1.2 [2/1] [U_]

unused devices: <none>
"""

RECOVERING = """Personalities : [raid1]
md127 : active raid1 nvme4n1[2] nvme0n1[0]
      1046528 blocks super 1.2 [2/1] [U_]
      [==>..................]  recovery = 12.5% (131072/1046528) finish=0.7min speed=20480K/sec

unused devices: <none>
"""

FAILED_AND_RECOVERING = """Personalities : [raid10]
md127 : active raid10 nvme5n1[4] nvme3n1[3] nvme2n1[2](F) nvme1n1[1] nvme0n1[0]
      2093056 blocks super 1.2 512K chunks 2 near-copies [4/3] [UU_U]
      [>....................]  recovery =  1.0% (10000/1046528) finish=2.0min speed=10000K/sec

unused devices: <none>
"""

RESYNC = """Personalities : [raid10]
md127 : active raid10 nvme3n1[3] nvme2n1[2] nvme1n1[1] nvme0n1[0]
      2093056 blocks super 1.2 64K chunks 2 near-copies [4/4] [UUUU]
      [=>...................]  resync =  8.0% (167424/2093056) finish=1.0min speed=27904K/sec

unused devices: <none>
"""


def probe(tmp_path: Path, mdstat: str) -> tuple:
    (tmp_path / "proc").mkdir(parents=True)
    (tmp_path / "proc/mdstat").write_text(mdstat)
    (tmp_path / "dev/md").mkdir(parents=True)
    (tmp_path / "dev/md127").write_text("")
    (tmp_path / "dev/md/data").symlink_to("../md127")
    return probing.Probes(str(tmp_path)).measure(CHECK)


def test_a_degraded_array_is_drift_naming_the_missing_member(tmp_path: Path) -> None:
    live, state, reason = probe(tmp_path, DEGRADED)
    assert state == "drifted" and reason == "/dev/md/data is degraded: nvme1n1 missing", (live, reason)


def test_an_array_rebuilding_its_lost_member_is_ok_and_says_so(tmp_path: Path) -> None:
    assert kernel.parse_mdstat(RECOVERING)["md127"]["recovery"] == "12.5%"
    assert "recovery" not in kernel.parse_mdstat(DEGRADED)["md127"]
    live, state, reason = probe(tmp_path, RECOVERING)
    assert (state, reason) == ("ok", "")
    assert live == "md127 active raid1 [2/1] [U_] recovering 12.5%: the lost member is being rebuilt"


def test_a_failed_member_stays_drift_while_a_spare_rebuilds(tmp_path: Path) -> None:
    live, state, reason = probe(tmp_path, FAILED_AND_RECOVERING)
    assert state == "drifted" and "nvme2n1 failed" in reason, (live, reason)


def test_the_first_sync_of_a_new_array_is_not_drift(tmp_path: Path) -> None:
    assert probe(tmp_path, RESYNC)[1] == "ok"


def test_members_declared_by_stable_id_are_resolved_and_a_lost_one_is_named_by_it(tmp_path: Path) -> None:
    """The role declares the drives as storage_devices names them (a lost drive has no kernel name,
    and a reboot may rename the others): a /dev/disk/by-id link on the host counts as the drive it
    points to, one that is gone is named by its id; a serial: id is counted, not named."""
    by_id = tmp_path / "dev/disk/by-id"
    by_id.mkdir(parents=True)
    (tmp_path / "dev/nvme0n1").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "dev/nvme0n1").write_text("")
    (by_id / "nvme-QEMU_DATA0").symlink_to("../../nvme0n1")
    lost = "/dev/disk/by-id/nvme-QEMU_DATA1"
    declared = {**CHECK, "members": ["/dev/disk/by-id/nvme-QEMU_DATA0", lost]}
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/mdstat").write_text(DEGRADED)
    (tmp_path / "dev/md").mkdir()
    (tmp_path / "dev/md127").write_text("")
    (tmp_path / "dev/md/data").symlink_to("../md127")
    probes = probing.Probes(str(tmp_path))
    live, state, reason = probes.measure(declared)
    assert state == "drifted" and reason == f"/dev/md/data is degraded: {lost} missing", (live, reason)
    by_serial = {**CHECK, "members": ["/dev/disk/by-id/nvme-QEMU_DATA0", "serial:DATA1"]}
    assert probes.measure(by_serial)[2] == "/dev/md/data is degraded: a member is missing"
