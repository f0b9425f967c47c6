"""What a drive holds, as both modules probe it (plugins/module_utils/provisioner_drives.py): the pure
parsers of wipefs and blkid output, probe() on fake commands, the two modules' wrappers, and probe()
on images made with the real tools when they are installed.

The outputs below were recorded with util-linux 2.38.1 (Debian 12's, as on the lab image) on image
files: a btrfs raid0 member (mkfs.btrfs -d raid0 -m raid1), a GPT disk (sfdisk), an md 1.2 member
written over an older XFS (the XFS at 0, the md superblock at 4 KiB), an ext4 with an XFS superblock
over its first sector (blkid: ambivalent), and a blank file."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import plugin_code
import pytest

pf = plugin_code.load("modules", "provisioner_facts")
dl = sys.modules[pf.gather_block_devices.__module__]  # provisioner_drive_list: the block devices
ps = plugin_code.load("modules", "provisioner_storage")
drives = ps.drives  # provisioner_drives, as the storage module imports it
assert drives is sys.modules[dl.probe.__module__]

FSID = "0f0e0d0c-0000-4000-8000-000000000001"
OLD_XFS = "11111111-2222-4333-8444-555555555555"
MD_UUID = "a1b2c3d4-0000-4000-8000-00000000abcd"

WIPEFS = {
    "btrfs-member": """{
   "signatures": [
      {
         "device": "a.img",
         "offset": "0x10040",
         "type": "btrfs",
         "uuid": "0f0e0d0c-0000-4000-8000-000000000001",
         "label": "data"
      }
   ]
}
""",
    "gpt": """{
   "signatures": [
      {
         "device": "g.img",
         "offset": "0x200",
         "type": "gpt",
         "uuid": null,
         "label": null
      },{
         "device": "g.img",
         "offset": "0x12bffe00",
         "type": "gpt",
         "uuid": null,
         "label": null
      },{
         "device": "g.img",
         "offset": "0x1fe",
         "type": "PMBR",
         "uuid": null,
         "label": null
      }
   ]
}
""",
    "md-member-over-xfs": """{
   "signatures": [
      {
         "device": "mdx.img",
         "offset": "0x1000",
         "type": "linux_raid_member",
         "uuid": "a1b2c3d4-0000-4000-8000-00000000abcd",
         "label": "gpu1:data"
      },{
         "device": "mdx.img",
         "offset": "0x0",
         "type": "xfs",
         "uuid": "11111111-2222-4333-8444-555555555555",
         "label": "old"
      }
   ]
}
""",
    "blank": '{\n   "signatures": [\n\n   ]\n}\n',
}

BLKID = {
    "btrfs-member": (0, "DEVNAME=a.img\nLABEL=data\nUUID=0f0e0d0c-0000-4000-8000-000000000001\n"
                        "UUID_SUB=7c21a581-918a-4f1f-8471-686be77cc5e6\nBLOCK_SIZE=4096\nTYPE=btrfs\nUSAGE=filesystem\n", ""),
    "gpt": (0, "DEVNAME=g.img\nPTUUID=a8ea8b47-897c-e04e-85db-8ed24f214c22\nPTTYPE=gpt\n", ""),
    # blkid stops at the RAID superblock: the XFS under it is wipefs's to see.
    "md-member-over-xfs": (0, "DEVNAME=mdx.img\nUUID=a1b2c3d4-0000-4000-8000-00000000abcd\n"
                              "UUID_SUB=99999999-0000-4000-8000-000000000001\nLABEL=gpu1:data\nVERSION=1.2\n"
                              "TYPE=linux_raid_member\nUSAGE=raid\n", ""),
    "blank": (2, "", ""),
    "ambivalent": (8, "", "blkid: amb.img: ambivalent result (probably more filesystems on the device, use wipefs(8) to "
                          "see more details)\n"),
    "not-permitted": (2, "", "blkid: error: /dev/vda: Operation not permitted\n"),
    "usage": (4, "", "usage"),
}


def test_parse_wipefs_json():
    assert drives.parse_wipefs_json(WIPEFS["btrfs-member"]) == [
        {"type": "btrfs", "label": "data", "uuid": FSID, "offset": "0x10040"}]
    assert [e["type"] for e in drives.parse_wipefs_json(WIPEFS["gpt"])] == ["gpt", "gpt", "PMBR"]
    assert drives.parse_wipefs_json(WIPEFS["md-member-over-xfs"]) == [
        {"type": "linux_raid_member", "label": "gpu1:data", "uuid": MD_UUID, "offset": "0x1000"},
        {"type": "xfs", "label": "old", "uuid": OLD_XFS, "offset": "0x0"},
    ]
    assert drives.parse_wipefs_json(WIPEFS["blank"]) == []
    assert drives.parse_wipefs_json("") == []  # older wipefs print nothing on a blank drive
    assert drives.parse_wipefs_json("wipefs: garbage") is None
    assert drives.parse_wipefs_json("[]") is None


@pytest.mark.parametrize(
    ("case", "tags", "ambiguous", "error"),
    [
        ("btrfs-member", {"LABEL": "data", "UUID": FSID, "UUID_SUB": "7c21a581-918a-4f1f-8471-686be77cc5e6",
                          "TYPE": "btrfs", "USAGE": "filesystem"}, False, None),
        ("gpt", {"PTUUID": "a8ea8b47-897c-e04e-85db-8ed24f214c22", "PTTYPE": "gpt"}, False, None),
        ("md-member-over-xfs", {"UUID": MD_UUID, "UUID_SUB": "99999999-0000-4000-8000-000000000001",
                                "LABEL": "gpu1:data", "VERSION": "1.2", "TYPE": "linux_raid_member", "USAGE": "raid"},
         False, None),
        ("blank", {}, False, None),
        ("ambivalent", {}, True, None),
        ("not-permitted", {}, False, "blkid -p failed: blkid: error: /dev/vda: Operation not permitted"),
        ("usage", {}, False, "blkid -p failed: usage"),
    ],
)
def test_parse_blkid_export(case, tags, ambiguous, error):
    assert drives.parse_blkid_export(*BLKID[case]) == {"tags": tags, "ambiguous": ambiguous, "error": error}


def _fake(monkeypatch, wipefs=None, blkid=None):
    """Fake commands: wipefs prints WIPEFS[wipefs] (None: not installed), blkid BLKID[blkid]."""
    calls = []

    def run(argv, timeout=60):
        calls.append(argv)
        if argv[0] == "wipefs":
            return None if wipefs is None else subprocess.CompletedProcess(argv, 0, WIPEFS[wipefs], "")
        if blkid is None:
            return None
        return subprocess.CompletedProcess(argv, *BLKID[blkid])

    monkeypatch.setattr(drives, "run", run)
    return calls


def test_probe_lists_every_signature_and_blkids_tags(monkeypatch):
    calls = _fake(monkeypatch, "md-member-over-xfs", "md-member-over-xfs")
    found = drives.probe("/dev/loop0")
    assert [e["type"] for e in found["entries"]] == ["linux_raid_member", "xfs"]
    assert found["tags"]["VERSION"] == "1.2" and found["error"] is None
    assert calls == [["wipefs", "--no-act", "--json", "/dev/loop0"], ["blkid", "-p", "-o", "export", "/dev/loop0"]]


def test_probe_falls_back_to_blkid_and_fails_only_without_both(monkeypatch):
    _fake(monkeypatch, None, "btrfs-member")
    assert drives.probe("/dev/loop0")["entries"] == [{"type": "btrfs", "label": "data", "uuid": FSID, "offset": None}]
    _fake(monkeypatch, None, "ambivalent")
    assert drives.probe("/dev/loop0")["entries"] == [{"type": "ambiguous", "label": None, "uuid": None, "offset": None}]
    _fake(monkeypatch, None, "not-permitted")
    assert drives.probe("/dev/loop0")["error"] == "blkid -p failed: blkid: error: /dev/vda: Operation not permitted"
    _fake(monkeypatch, None, None)
    assert drives.probe("/dev/loop0")["error"] == "neither wipefs nor blkid is installed (util-linux)"
    # wipefs answered: a failing blkid does not make the drive unprobed
    _fake(monkeypatch, "blank", "usage")
    assert drives.probe("/dev/loop0") == {"entries": [], "tags": {}, "ambiguous": False, "error": None}


def test_probe_at_an_offset_and_without_tags(monkeypatch):
    calls = _fake(monkeypatch, "blank", "blank")
    drives.probe("/dev/loop0", offset=135266304)
    assert calls == [["blkid", "-p", "-O", "135266304", "-o", "export", "/dev/loop0"]]
    calls = _fake(monkeypatch, "gpt", "gpt")
    assert [e["type"] for e in drives.probe("/dev/loop0", tags=False)["entries"]] == ["gpt", "gpt", "PMBR"]
    assert [argv[0] for argv in calls] == ["wipefs"]


@pytest.mark.parametrize(
    ("wipefs", "blkid", "module", "facts"),
    [
        ("md-member-over-xfs", "md-member-over-xfs",
         ([{"type": "linux_raid_member", "label": "gpu1:data", "uuid": MD_UUID, "offset": "0x1000"},
           {"type": "xfs", "label": "old", "uuid": OLD_XFS, "offset": "0x0"}], None),
         (["linux_raid_member"], "ok", MD_UUID)),
        ("gpt", "gpt", ([{"type": "gpt", "label": None, "uuid": None, "offset": "0x200"},
                         {"type": "gpt", "label": None, "uuid": None, "offset": "0x12bffe00"},
                         {"type": "PMBR", "label": None, "uuid": None, "offset": "0x1fe"}], None),
         (["gpt"], "ok", None)),
        (None, "ambivalent", ([{"type": "ambiguous", "label": None, "uuid": None, "offset": None}], None),
         (["ambiguous"], "ok", None)),
        (None, "not-permitted", (None, "blkid -p failed: blkid: error: /dev/vda: Operation not permitted"),
         ([], "failed", None)),
        (None, "blank", ([], None), ([], "ok", None)),
    ],
)
def test_the_modules_wrappers(monkeypatch, wipefs, blkid, module, facts):
    """The storage module lists every signature (wipefs), the facts what blkid names first."""
    _fake(monkeypatch, wipefs, blkid)
    assert ps.drives.signatures_of("/dev/loop0") == module
    assert dl.probe_device("/dev/loop0") == facts


# --------------------------------------------------------------------------
# the real tools, on images
# --------------------------------------------------------------------------


@pytest.mark.skipif(not (shutil.which("mkfs.xfs") and shutil.which("wipefs") and shutil.which("blkid")),
                    reason="xfsprogs or util-linux not installed here")
def test_probe_on_images(tmp_path: Path):
    xfs = tmp_path / "xfs.img"
    xfs.write_bytes(b"")
    subprocess.run(["truncate", "--size", "300M", str(xfs)], check=True)
    subprocess.run(["mkfs.xfs", "-q", "-L", "old", "-m", f"uuid={OLD_XFS}", str(xfs)], check=True)
    found = drives.probe(str(xfs))
    assert found["entries"] == [{"type": "xfs", "label": "old", "uuid": OLD_XFS, "offset": "0x0"}]
    assert found["tags"]["TYPE"] == "xfs" and found["tags"]["UUID"] == OLD_XFS

    # An XFS at an offset (as inside a stopped array's first member at its data offset): blkid -O.
    member = tmp_path / "member.img"
    subprocess.run(["truncate", "--size", "302M", str(member)], check=True)
    subprocess.run(["dd", f"if={xfs}", f"of={member}", "bs=1M", "seek=2", "count=8", "conv=notrunc", "status=none"],
                   check=True)
    assert drives.probe(str(member))["entries"] == []
    inside = drives.probe(str(member), offset=2 * 1024**2)
    assert inside["tags"]["TYPE"] == "xfs" and inside["tags"]["UUID"] == OLD_XFS

    blank = tmp_path / "blank.img"
    subprocess.run(["truncate", "--size", "10M", str(blank)], check=True)
    assert drives.probe(str(blank)) == {"entries": [], "tags": {}, "ambiguous": False, "error": None}
