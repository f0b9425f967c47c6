"""verify's check of the data array (provisioner/checks/test_storage.py) on a fake host: a degraded
array fails with one line naming the array, how many of how many drives run, the missing drive
and the fix; a complete array, one rebuilding its member, and RAID0 pass."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from provisioner.checks import test_storage as check

LOST = "/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_DATA1"
BUILT = {"uses_md": True, "storage_md_name": "data", "storage_devices": ["/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_DATA0", LOST]}


class Host:
    def __init__(self, mdstat: str, absent: tuple[str, ...] = ()) -> None:
        self.mdstat, self.absent = mdstat, absent

    def user(self):
        return SimpleNamespace(uid=0)

    def check_output(self, command: str) -> str:
        assert command == "readlink -f /dev/md/data", command
        return "/dev/md127"

    def file(self, path: str):
        if path == "/proc/mdstat":
            return SimpleNamespace(exists=True, content_string=self.mdstat)
        return SimpleNamespace(exists=path not in self.absent)


def mdstat(lines: str) -> str:
    return f"Personalities : [raid1] [raid0]\nmd126 : active raid1 sda[0]\n      9 blocks [2/1] [U_]\n\n{lines}\nunused devices: <none>\n"


def test_a_degraded_array_fails_naming_it_the_drives_and_the_fix() -> None:
    host = Host(mdstat("md127 : active raid1 nvme0n1[0]\n      1046528 blocks super 1.2 [2/1] [U_]\n"), absent=(LOST,))
    with pytest.raises(pytest.fail.Exception) as exc:
        check.test_md_array_runs_with_every_drive(host, BUILT)
    assert str(exc.value) == (
        f"the data array /dev/md/data (md127) runs degraded on 1 of 2 drives, missing: {LOST} - put the drive back or "
        "list a blank drive in its place in storage_devices, then run provisioner up (it re-adds or adds it and the "
        "array rebuilds)"
    )


def test_a_failed_member_is_named() -> None:
    host = Host(mdstat("md127 : active raid1 nvme1n1[1](F) nvme0n1[0]\n      1046528 blocks super 1.2 [2/1] [U_]\n"))
    with pytest.raises(pytest.fail.Exception, match=r"runs degraded on 1 of 2 drives, missing: nvme1n1 - put"):
        check.test_md_array_runs_with_every_drive(host, BUILT)


@pytest.mark.parametrize(
    "lines",
    [
        "md127 : active raid1 nvme1n1[1] nvme0n1[0]\n      1046528 blocks super 1.2 [2/2] [UU]\n",
        "md127 : active raid1 nvme3n1[2] nvme0n1[0]\n      1046528 blocks super 1.2 [2/1] [U_]\n"
        "      [=>...]  recovery =  8.1% (85248/1046528) finish=0.7min speed=21312K/sec\n",
        "md127 : active raid0 nvme1n1[1] nvme0n1[0]\n      2093056 blocks super 1.2 512k chunks\n",
    ],
    ids=["clean", "recovering", "raid0"],
)
def test_a_complete_or_rebuilding_array_passes(lines: str) -> None:
    check.test_md_array_runs_with_every_drive(Host(mdstat(lines)), BUILT)


def test_an_array_not_assembled_fails_with_the_fix() -> None:
    with pytest.raises(AssertionError, match=r"/dev/md/data \(md127\) is not in /proc/mdstat: .*run provisioner up"):
        check.test_md_array_runs_with_every_drive(Host(mdstat("")), BUILT)
