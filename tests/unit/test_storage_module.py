"""The provisioner_storage module and the storage role's templates, without a lab server: id
resolution on a fake /sys and /dev, superblock parsers (on images made with the real mkfs tools
when installed), the decisions on hand-made drives, and the templates rendered by Ansible itself."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import plugin_code
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "storage"
VENV_BIN = Path(sys.executable).parent
SEP = "\u2014"  # the em dash of the refusal line

ps = plugin_code.load("modules", "provisioner_storage")
sb = plugin_code.load("module_utils", "provisioner_superblocks")  # the raw superblock parsers


# --------------------------------------------------------------------------
# the decision, on hand-made drives
# --------------------------------------------------------------------------


def member(kname, id_=None, **extra):
    path = f"/dev/{kname}"
    base = {
        "kname": kname,
        "id": id_ or path,
        "path": path,
        "cmd_path": id_ or path,
        "by_id": [id_] if id_ and id_.startswith("/dev/disk/by-id/") else [],
        "size_bytes": 4 * 10**12,
        "read_only": False,
        "serial": None,
        "wwid": None,
        "model": None,
        "nvme": kname.startswith("nvme"),
        "loop": kname.startswith("loop"),
        "backing_file": None,
        "scheduler": "none",
        "read_ahead_kb": 128,
        "partitions": [],
        "holders": [],
        "mountpoints": [],
        "signatures": [],
        "probe_error": None,
        "btrfs": None,
        "md": None,
        "xfs": None,
        "wipe_allowed": False,
    }
    base.update(extra)
    return base


def spec(level="raid0", backend="mdadm", **extra):
    return {"level": level, "backend": backend, "md_name": "data", "chunk_kb": 512, "mountpoint": "/data",
            "hostname": "gpu1", **extra}


A = "/dev/disk/by-id/nvme-Samsung_SSD_990_PRO_4TB_S7KGNU0X100001"
B = "/dev/disk/by-id/nvme-Samsung_SSD_990_PRO_4TB_S7KGNU0X100002"
C = "/dev/disk/by-id/nvme-Samsung_SSD_990_PRO_4TB_S7KGNU0X100003"
D = "/dev/disk/by-id/nvme-Samsung_SSD_990_PRO_4TB_S7KGNU0X100004"


def two_blank():
    return [member("nvme0n1", A, serial="S7KGNU0X100001"), member("nvme1n1", B, serial="S7KGNU0X100002")]


def test_mdadm_raid0_plans_the_exact_commands():
    r = ps.decide(spec(), two_blank())
    assert r["refusals"] == [] and r["action"] == "create"
    md_uuid, fs_uuid = r["md_uuid"], r["fs_uuid"]
    assert [c["argv"] for c in r["commands"]] == [
        ["mdadm", "--create", "/dev/md/data", "--run", "--metadata=1.2", "--level=raid0", "--raid-devices=2",
         "--chunk=512", "--name=data", "--homehost=gpu1", f"--uuid={md_uuid}", A, B],
        ["mkfs.xfs", "-L", "data", "-m", f"uuid={fs_uuid}", "-d", "su=512k,sw=2", "/dev/md/data"],
    ]
    assert len(md_uuid.split(":")) == 4 and all(len(g) == 8 for g in md_uuid.split(":"))
    assert r["mdadm_array_line"] == f"ARRAY /dev/md/data metadata=1.2 UUID={md_uuid}"
    assert r["fstab_line"] == f"UUID={fs_uuid} /data xfs noatime,nofail 0 0"
    assert r["needs_md_driver"] is True


def test_mdadm_raid10_and_raid1_alignment():
    four = [*two_blank(), member("nvme2n1", C, serial="3"), member("nvme3n1", D, serial="4")]
    r10 = ps.decide(spec("raid10"), four)
    assert r10["commands"][1]["argv"][5:7] == ["-d", "su=512k,sw=2"]  # 4 drives, 2 copies: 2 data drives
    assert "--chunk=512" in r10["commands"][0]["argv"]
    r1 = ps.decide(spec("raid1"), two_blank())
    assert not any(a.startswith("--chunk") for a in r1["commands"][0]["argv"])
    assert "-d" not in r1["commands"][1]["argv"]
    odd = ps.decide(spec("raid10"), four[:3])
    assert odd["action"] == "refuse"


def test_single_xfs_and_btrfs_layouts():
    one = [member("nvme0n1", A)]
    r = ps.decide(spec("single"), one)
    assert r["commands"][0]["argv"] == ["mkfs.xfs", "-L", "data", "-m", f"uuid={r['fs_uuid']}", A]
    assert r["uses_md"] is False and r["mdadm_array_line"] is None
    b = ps.decide(spec("raid0", "btrfs"), two_blank())
    assert b["commands"][0]["argv"] == [
        "mkfs.btrfs", "--label", "data", "--uuid", b["fs_uuid"], "--data", "raid0", "--metadata", "raid1", A, B]
    assert b["mount"] == {"src": f"UUID={b['fs_uuid']}", "path": "/data", "fstype": "btrfs",
                          "opts": f"noatime,nofail,device={A},device={B}"}
    one_btrfs = ps.decide(spec("single", "btrfs"), one)
    assert one_btrfs["commands"][0]["argv"][5:9] == ["--data", "single", "--metadata", "dup"]


def test_planned_uuids_are_stable_and_differ_per_drive_set():
    first = ps.decide(spec(), two_blank())
    again = ps.decide(spec(), two_blank())
    assert (first["fs_uuid"], first["md_uuid"]) == (again["fs_uuid"], again["md_uuid"])
    other = [member("nvme0n1", A, serial="X1"), member("nvme1n1", B, serial="X2")]
    assert ps.decide(spec(), other)["fs_uuid"] != first["fs_uuid"]
    loops = [member("loop0", backing_file="/tmp/a.img"), member("loop1", backing_file="/tmp/b.img")]
    moved = [member("loop0", backing_file="/tmp/c.img"), member("loop1", backing_file="/tmp/b.img")]
    assert ps.decide(spec(), loops)["fs_uuid"] != ps.decide(spec(), moved)["fs_uuid"]


def test_a_drive_with_a_filesystem_is_refused_naming_it_and_the_option():
    drives = two_blank()
    drives[1] = member("loop3", "/dev/disk/by-id/X",
                       signatures=[{"type": "ext4", "label": "L", "uuid": "1b2c", "offset": "0x438"}])
    r = ps.decide(spec(), drives)
    assert r["action"] == "refuse" and r["commands"] == []
    assert r["refusals"] == [
        f"storage: refusing /dev/disk/by-id/X (/dev/loop3): holds an ext4 filesystem (label L, UUID 1b2c) {SEP} "
        "add it to storage_wipe_devices to allow wiping it"
    ]


def test_partitions_and_raid_signatures_are_refused_too():
    parts = member("nvme1n1", B, partitions=["nvme1n1p1", "nvme1n1p2"], signatures=[{"type": "gpt"}])
    r = ps.decide(spec(), [member("nvme0n1", A), parts])
    assert "holds 2 partition(s) (nvme1n1p1, nvme1n1p2) and a GPT partition table" in r["refusals"][0]
    raid = member("nvme1n1", B, signatures=[{"type": "linux_raid_member", "label": "old:scratch"}],
                  md={"uuid": "a:b:c:d", "name": "old:scratch", "short_name": "scratch", "level": "raid1",
                      "chunk_kb": 0, "raid_disks": 2, "data_offset": 0, "role": 0})
    r = ps.decide(spec(), [member("nvme0n1", A), raid])
    assert "an md RAID member signature (label old:scratch)" in r["refusals"][0]
    assert "storage_wipe_devices" in r["refusals"][0]


def test_wiping_allowed_wipes_first_and_forces_mkfs():
    drives = [member("nvme0n1", A),
              member("nvme1n1", B, partitions=["nvme1n1p1"], signatures=[{"type": "gpt"}], wipe_allowed=True)]
    r = ps.decide(spec("raid0", "btrfs"), drives)
    assert r["action"] == "create" and r["wipe"] == [B]
    argvs = [c["argv"] for c in r["commands"]]
    assert argvs[:3] == [["wipefs", "--all", "/dev/nvme1n1p1"], ["wipefs", "--all", B], ["blockdev", "--rereadpt", B]]
    assert argvs[3][:2] == ["mkfs.btrfs", "--force"]


def test_mounted_or_held_drives_are_refused_even_when_wiping_is_allowed():
    mounted = member("nvme1n1", B, mountpoints=["/srv"], signatures=[{"type": "ext4"}], wipe_allowed=True)
    r = ps.decide(spec(), [member("nvme0n1", A), mounted])
    assert r["refusals"] == [
        f"storage: refusing {B} (/dev/nvme1n1): mounted at /srv {SEP} unmount it first; storage never unmounts or "
        "wipes a mounted drive, not even one in storage_wipe_devices"]
    root = member("nvme1n1", B, mountpoints=["/", "/boot"], wipe_allowed=True)
    assert "(the root disk)" in ps.decide(spec(), [member("nvme0n1", A), root])["refusals"][0]
    held = member("nvme1n1", B, holders=["md127"], wipe_allowed=True)
    assert "in use by md127" in ps.decide(spec(), [member("nvme0n1", A), held])["refusals"][0]


def _btrfs(fsid, devid, num=2, profiles=None):
    return {"btrfs": {"fsid": fsid, "devid": devid, "num_devices": num, "label": "data"},
            "btrfs_profiles": profiles or {"data": ["raid0"], "metadata": ["raid1"], "system": ["raid1"]},
            "signatures": [{"type": "btrfs", "label": "data", "uuid": fsid}]}


def test_a_matching_btrfs_is_adopted_a_different_one_refused():
    fsid = "0f0e0d0c-0000-4000-8000-000000000001"
    drives = [member("loop0", **_btrfs(fsid, 1)), member("loop1", **_btrfs(fsid, 2))]
    r = ps.decide(spec("raid0", "btrfs"), drives)
    assert r["action"] == "adopt" and r["commands"] == [] and r["fs_uuid"] == fsid
    drives[0]["mountpoints"] = drives[1]["mountpoints"] = ["/data"]
    assert ps.decide(spec("raid0", "btrfs"), drives)["action"] == "adopt"
    r = ps.decide(spec("raid0", "btrfs"), drives, mountpoint_state={"mounted": True})
    assert r["action"] == "adopt", "its own mount at /data is not a foreign mount"
    drives[0]["mountpoints"] = drives[1]["mountpoints"] = ["/mnt/old"]
    r = ps.decide(spec("raid0", "btrfs"), drives)
    assert "it is mounted at /mnt/old, not at /data" in r["refusals"][0]
    raid1 = {"data": ["raid1"], "metadata": ["raid1"], "system": ["raid1"]}
    drives = [member("loop0", **_btrfs(fsid, 1, profiles=raid1)), member("loop1", **_btrfs(fsid, 2, profiles=raid1))]
    r = ps.decide(spec("raid0", "btrfs"), drives)
    assert r["action"] == "refuse"
    assert "that btrfs filesystem is data raid1, metadata raid1, not the requested data raid0, metadata raid1" in r["refusals"][0]
    drives = [member("loop0", **_btrfs(fsid, 1, num=3)), member("loop1", **_btrfs(fsid, 2, num=3))]
    assert "spans 3 device(s), 2 of them listed" in ps.decide(spec("raid0", "btrfs"), drives)["refusals"][0]


def _md(uuid_, role, level="raid0", disks=2, fs=None):
    return {"md": {"uuid": uuid_, "name": "gpu1:data", "short_name": "data", "level": level, "chunk_kb": 512,
                   "raid_disks": disks, "data_offset": 1 << 20, "role": role, "filesystem": fs},
            "signatures": [{"type": "linux_raid_member", "label": "gpu1:data", "uuid": uuid_}]}


def test_a_matching_md_array_is_adopted_or_assembled():
    u = "11111111:22222222:33333333:44444444"
    xfs = {"kind": "xfs", "uuid": "5e1f0000-0000-4000-8000-000000000001"}
    arrays = {"md127": {"device": "/dev/md127", "level": "raid0", "raid_disks": 2, "chunk_kb": 512,
                        "slaves": ["nvme0n1", "nvme1n1"], "majmin": "9:127", "state": "clean"}}
    running = [member("nvme0n1", A, holders=["md127"], **_md(u, 0, fs=xfs)),
               member("nvme1n1", B, holders=["md127"], **_md(u, 1, fs=xfs))]
    r = ps.decide(spec(), running, arrays)
    assert r["action"] == "adopt" and r["commands"] == [] and r["md_uuid"] == u and r["fs_uuid"] == xfs["uuid"]
    assert r["mdadm_array_line"] == f"ARRAY /dev/md/data metadata=1.2 UUID={u}" and r["fs_device"] == "/dev/md127"
    stopped = [member("nvme0n1", A, **_md(u, 0, fs=xfs)), member("nvme1n1", B, **_md(u, 1, fs=xfs))]
    r = ps.decide(spec(), stopped, {})
    assert r["action"] == "assemble"
    assert [c["argv"] for c in r["commands"]] == [["mdadm", "--assemble", "/dev/md/data", f"--uuid={u}", A, B]]
    blank = [member("nvme0n1", A, **_md(u, 0)), member("nvme1n1", B, **_md(u, 1))]
    r = ps.decide(spec(), blank, {})
    assert [c["argv"][0] for c in r["commands"]] == ["mdadm", "mkfs.xfs"]
    other = [member("nvme0n1", A, **_md(u, 0, level="raid1")), member("nvme1n1", B, **_md(u, 1, level="raid1"))]
    r = ps.decide(spec(), other, {})
    assert r["action"] == "refuse" and "is raid1 over 2 drive(s), not the requested raid0 over 2" in r["refusals"][0]


def test_with_udev_running_the_create_waits_for_the_arrays_name_before_mkfs():
    argv = [c["argv"] for c in ps.decide(spec(udev=True), two_blank())["commands"]]
    assert [a[0] for a in argv] == ["mdadm", "udevadm", "mkfs.xfs"] and argv[1] == ["udevadm", "settle", "--timeout=120"]
    assert argv[2][-1] == "/dev/md/data"
    u = "11111111:22222222:33333333:44444444"
    stopped = [member("nvme0n1", A, **_md(u, 0)), member("nvme1n1", B, **_md(u, 1))]
    argv = [c["argv"][:2] for c in ps.decide(spec(udev=True), stopped, {})["commands"]]
    assert argv == [["mdadm", "--assemble"], ["udevadm", "settle"], ["mkfs.xfs", "-L"]]


def test_an_xfs_on_its_own_array_that_storage_did_not_make_is_made_again_only_with_wipe():
    drives = two_blank()
    planned = ps.decide(spec(), drives)
    u, ours = planned["md_uuid"], planned["fs_uuid"]
    arrays = {"md127": {"device": "/dev/md127", "level": "raid0", "raid_disks": 2, "chunk_kb": 512,
                        "slaves": ["nvme0n1", "nvme1n1"], "majmin": "9:127", "state": "clean"}}

    def running(fs_uuid, wipe=False):
        xfs = {"kind": "xfs", "uuid": fs_uuid}
        return [{**d, "holders": ["md127"], "wipe_allowed": wipe, **_md(u, i, fs=xfs)} for i, d in enumerate(drives)]

    # Its own filesystem: adopted, nothing to do.
    r = ps.decide(spec(), running(ours), arrays)
    assert r["action"] == "adopt" and r["commands"] == [] and r["warnings"] == []
    # The earlier contents showing through (a create that stopped before mkfs): refused without wipe ...
    stale = "5e1f0000-0000-4000-8000-000000000001"
    r = ps.decide(spec(), running(stale), arrays)
    assert r["action"] == "refuse" and r["commands"] == []
    assert r["refusals"] == [
        f"storage: the array {u} that storage created holds an XFS (UUID {stale}) that storage did not make (left "
        f"from the drives' earlier contents, or made by hand) {SEP} add its drives to storage_wipe_devices to make "
        "the filesystem again, or mount it by hand"]
    # ... and made again (forced, with the planned UUID) on the running array when the drives may be wiped.
    r = ps.decide(spec(), running(stale, wipe=True), arrays)
    assert r["action"] == "mkfs" and r["fs_uuid"] == ours and "made again" in r["warnings"][0]
    assert [c["argv"] for c in r["commands"]] == [
        ["mkfs.xfs", "-f", "-L", "data", "-m", f"uuid={ours}", "-d", "su=512k,sw=2", "/dev/md/data"]]
    # An array storage did not create keeps its filesystem, whatever its UUID.
    other = [{**d, "holders": ["md127"], **_md("11111111:22222222:33333333:44444444", i,
                                               fs={"kind": "xfs", "uuid": stale})} for i, d in enumerate(drives)]
    assert ps.decide(spec(), other, arrays)["action"] == "adopt"


def test_the_mount_point_must_be_free():
    r = ps.decide(spec(), two_blank(), mountpoint_state={"mounted": True, "mounted_source": "/dev/sdb1",
                                                         "mounted_fstype": "ext4"})
    assert r["refusals"] == [f"storage: storage_mountpoint /data is already a mount of /dev/sdb1 (ext4) {SEP} choose "
                             "another mount point or unmount it"]
    r = ps.decide(spec(), two_blank(), mountpoint_state={"entries": 3})
    assert "is a directory with 3 entries" in r["refusals"][0]


def test_foreign_fstab_lines_for_the_mount_point():
    r = ps.decide(spec(), two_blank())
    entries = ps.parse_fstab(f"{r['fstab_line']}\n/dev/sdb1 /data ext4 defaults 0 2\n# UUID=x /data xfs\n"
                             "/dev/md/data /data xfs defaults 0 0\nUUID=y /srv xfs defaults 0 0\n")
    assert ps.foreign_fstab_entries(entries, r, root="/nonexistent") == ["/dev/sdb1 /data ext4 defaults 0 2"]


def test_mdadm_conf_lines_of_the_array_outside_the_role_block():
    u = "3bf41793:13955273:be72f86c:7985bae2"
    text = (
        "HOMEHOST <system>\nARRAY /dev/md/data metadata=1.2 UUID=3bf41793:13955273:be72f86c:7985bae2 name=gpu1:data\n"
        "ARRAY /dev/md/old metadata=1.2 UUID=00000000:13955273:be72f86c:7985bae2\n"
        f"# BEGIN {ps.MDADM_MARKER}\nARRAY /dev/md/data metadata=1.2 UUID={u}\n# END {ps.MDADM_MARKER}\n"
    )
    assert ps.mdadm_conf_other_lines(text, u) == [
        "ARRAY /dev/md/data metadata=1.2 UUID=3bf41793:13955273:be72f86c:7985bae2 name=gpu1:data"]
    assert ps.mdadm_conf_other_lines(text.split("ARRAY /dev/md/old")[0].replace("ARRAY", "#ARRAY"), u) == []
    vars_marker = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["_storage_mdadm_marker"]
    assert vars_marker == "# {mark} " + ps.MDADM_MARKER


def test_too_few_drives():
    assert ps.decide(spec(), [member("nvme0n1", A)])["refusals"] == [
        "storage: raid0 needs at least 2 device(s), storage_devices names 1"]


# --------------------------------------------------------------------------
# ids resolved on a fake /sys and /dev
# --------------------------------------------------------------------------


@pytest.fixture()
def fake_root(tmp_path):
    root = tmp_path
    disks = {
        "nvme0n1": {"device/serial": "S7KGNU0X100001  ", "wwid": "eui.0025384b21406c01", "size": "7814037168"},
        "sda": {"device/serial": "ZR5ABC12", "device/wwid": "naa.5000c500d4a1b2c3", "size": "100"},
        "loop3": {"size": "2097152", "loop/backing_file": "/tmp/a.img"},
    }
    for name, files in disks.items():
        for rel, text in files.items():
            f = root / "sys/block" / name / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text + "\n")
    part = root / "sys/class/block/nvme0n1p1"
    part.mkdir(parents=True)
    (part / "partition").write_text("1\n")
    by_id = root / "dev/disk/by-id"
    by_id.mkdir(parents=True)
    (by_id / "nvme-Samsung_S7KGNU0X100001").symlink_to("../../nvme0n1")
    (by_id / "nvme-Samsung_S7KGNU0X100001-part1").symlink_to("../../nvme0n1p1")
    return str(root)


def test_ids_resolve_by_id_serial_and_wwn(fake_root):
    assert ps.drives.resolve("/dev/disk/by-id/nvme-Samsung_S7KGNU0X100001", fake_root) == ("nvme0n1", None)
    assert ps.drives.resolve("serial:S7KGNU0X100001", fake_root) == ("nvme0n1", None)
    assert ps.drives.resolve("wwn:eui.0025384b21406c01", fake_root) == ("nvme0n1", None)
    assert ps.drives.resolve("wwn:0x5000c500d4a1b2c3", fake_root) == ("sda", None)
    assert ps.drives.resolve("serial:ZR5ABC12", fake_root) == ("sda", None)


def test_unstable_and_unknown_ids_are_refused(fake_root):
    kname, why = ps.drives.resolve("/dev/nvme0n1", fake_root, links=ps.drives.by_id_links(fake_root))
    assert kname is None
    assert why == (f"/dev/nvme0n1 is a kernel name, which can change across reboots {SEP} name it "
                   "/dev/disk/by-id/nvme-Samsung_S7KGNU0X100001 (storage_allow_unstable_names: true is for tests and "
                   "VMs only)")
    assert ps.drives.resolve("/dev/loop3", fake_root, allow_unstable=True) == ("loop3", None)
    assert "is a partition" in ps.drives.resolve("/dev/disk/by-id/nvme-Samsung_S7KGNU0X100001-part1", fake_root)[1]
    assert "does not exist" in ps.drives.resolve("/dev/disk/by-id/nope", fake_root)[1]
    assert "matches no block device" in ps.drives.resolve("serial:NOPE", fake_root)[1]
    assert "is not a stable device id" in ps.drives.resolve("nvme0n1", fake_root)[1]
    assert "is not a stable device id" in ps.drives.resolve("/dev/disk/by-uuid/abc", fake_root)[1]


def test_inspect_reads_sysfs(fake_root):
    d = ps.drives.inspect_device("nvme0n1", fake_root, probe=False)
    assert d["serial"] == "S7KGNU0X100001" and d["nvme"] and d["size_bytes"] == 7814037168 * 512


# --------------------------------------------------------------------------
# superblocks: synthetic md, real btrfs/XFS images where the tools are installed
# --------------------------------------------------------------------------


def test_md_superblock_parser():
    buf = bytearray(4096)
    struct.pack_into("<II", buf, 0, sb.MD_MAGIC, 1)
    set_uuid = uuid.UUID("a1b2c3d4-0000-4000-8000-00000000abcd").bytes
    buf[16:32] = set_uuid
    buf[32:41] = b"gpu1:data"
    struct.pack_into("<i", buf, 72, 0)
    struct.pack_into("<II", buf, 88, 1024, 2)  # chunk in sectors, raid_disks
    struct.pack_into("<Q", buf, 128, 264192)  # data_offset in sectors
    struct.pack_into("<I", buf, 160, 1)  # dev_number
    struct.pack_into("<I", buf, 220, 2)  # max_dev
    struct.pack_into("<HH", buf, 256, 0, 1)
    md = sb.parse_md_super(bytes(buf))
    assert md == {"uuid": "a1b2c3d4:00004000:80000000:0000abcd", "name": "gpu1:data", "short_name": "data",
                  "level": "raid0", "chunk_kb": 512, "raid_disks": 2, "data_offset": 264192 * 512, "role": 1}
    assert sb.parse_md_super(bytes(4096)) is None


@pytest.mark.skipif(shutil.which("mkfs.btrfs") is None, reason="btrfs-progs not installed here")
@pytest.mark.parametrize("data,metadata", [("raid0", "raid1"), ("raid1", "raid1"), ("single", "raid1")])
def test_btrfs_profiles_read_from_images(tmp_path, data, metadata):
    images = [tmp_path / "a.img", tmp_path / "b.img"]
    for image in images:
        image.write_bytes(b"")
        os.truncate(image, 512 * 1024**2)
    fsid = str(uuid.uuid4())
    subprocess.run(["mkfs.btrfs", "-q", "-f", "-U", fsid, "-L", "data", "-d", data, "-m", metadata,
                    *map(str, images)], check=True, capture_output=True)
    sbs = [ps.superblocks.parse_btrfs_super(ps.superblocks.read_at(str(i), ps.superblocks.BTRFS_SUPER_OFFSET, 4096)) for i in images]
    assert [sb["fsid"] for sb in sbs] == [fsid, fsid]
    assert sorted(sb["devid"] for sb in sbs) == [1, 2] and sbs[0]["num_devices"] == 2 and sbs[0]["label"] == "data"
    by_devid = {sb["devid"]: str(i) for sb, i in zip(sbs, images, strict=False)}
    for sb in sbs:  # either member alone can read the chunk tree (metadata is mirrored)
        profiles = ps.superblocks.btrfs_profiles(by_devid, sb)
        assert profiles["data"] == [data] and profiles["metadata"] == [metadata], profiles


@pytest.mark.skipif(shutil.which("mkfs.xfs") is None, reason="xfsprogs not installed here (install.sh --test installs it)")
def test_xfs_superblock_from_an_image(tmp_path):
    image = tmp_path / "x.img"
    image.write_bytes(b"")
    os.truncate(image, 320 * 1024**2)
    fs_uuid = str(uuid.uuid4())
    subprocess.run(["mkfs.xfs", "-q", "-L", "data", "-m", f"uuid={fs_uuid}", str(image)], check=True)
    assert ps.superblocks.parse_xfs_super(ps.superblocks.read_at(str(image), 0, 4096)) == {"uuid": fs_uuid, "label": "data"}
    # A drive's own XFS is read from what wipefs reports (and blkid where wipefs cannot answer), the same
    # fields as the raw superblock, a label or none.
    sigs, error = ps.drives.signatures_of(str(image))
    assert error is None and ps.drives.xfs_of(sigs) == {"uuid": fs_uuid, "label": "data"}
    blkid = ps.drives.probe(str(image), wipefs=False)
    assert ps.drives.xfs_of(blkid["entries"]) == {"uuid": fs_uuid, "label": "data"}
    subprocess.run(["mkfs.xfs", "-q", "-f", "-m", f"uuid={fs_uuid}", str(image)], check=True)
    assert ps.drives.xfs_of(ps.drives.signatures_of(str(image))[0]) == {"uuid": fs_uuid, "label": ""}
    assert ps.superblocks.parse_xfs_super(ps.superblocks.read_at(str(image), 0, 4096))["label"] == ""
    assert ps.drives.xfs_of([{"type": "linux_raid_member", "uuid": "u", "label": "h:data", "offset": "0x1000"}]) is None


# --------------------------------------------------------------------------
# the role's templates, rendered by Ansible
# --------------------------------------------------------------------------


def _mdadm_layout() -> dict:
    return ps.decide(spec(), two_blank())


def _udev_md_layout() -> dict:
    drives = [member("nvme0n1", A, wwid="eui.0025384b21406c01"), member("nvme1n1", B, serial="S7KGNU0X100002")]
    return ps.decide(spec(), drives)


def _udev_loops_layout() -> dict:
    return ps.decide(spec("raid0", "btrfs"), [member("loop0"), member("loop1")])


def _plan_layout() -> dict:
    drives = two_blank()
    drives[1].update(signatures=[{"type": "ext4", "label": "old"}], wipe_allowed=True)
    layout = ps.decide(spec(), drives)
    for m in layout["members"]:
        m["contents"] = ps.drive_rules.describe_contents(m)
    return layout


# Each test's template and layout (the decisions are planned, the same each time), rendered by
# Ansible's template module in one ansible-playbook run (playbook_cases): one host each. The
# plan file names its host: gpu1.
RENDERS = {
    "mdadm-conf": ("mdadm.conf.j2", _mdadm_layout),
    "udev-md": ("60-provisioner-storage.rules.j2", _udev_md_layout),
    "udev-loops": ("60-provisioner-storage.rules.j2", _udev_loops_layout),
    "gpu1": ("storage-plan.txt.j2", _plan_layout),
}


@pytest.fixture(scope="module")
def render_run(tmp_path_factory):
    from playbook_cases import local_env, local_host, run_cases

    role_vars = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    hosts = {
        host: local_host({
            "_storage_layout": layout(),
            "_storage_status": "skipped: no md driver in this kernel (/proc/mdstat absent) - nothing was created",
            "_storage_check_prefix": "",
            "storage_read_ahead_kb": 4096,
            "storage_owner_group": "ml",
            "storage_mount_mode": "2775",
            **role_vars,
            "case_template": str(ROLE / "templates" / template),
        })
        for host, (template, layout) in RENDERS.items()
    }
    play = [{"name": "Render", "hosts": "all", "gather_facts": False, "tasks": [{
        "name": "Render the template",
        "ansible.builtin.template": {"src": "{{ case_template }}", "dest": "{{ cases_dir }}/{{ inventory_hostname }}.out",
                                     "mode": "0644"},
    }]}]
    return run_cases(tmp_path_factory, "storage-templates", play, hosts, cwd=REPO, env=lambda workdir: local_env())


def test_the_templates_render(render_run):
    assert render_run.returncode == 0, render_run.tail()


def render(run, host: str) -> str:
    """Host's template of roles/storage/templates rendered with its layout (check: no)."""
    assert not run.failed(host), run.tail()
    return (Path(run.workdir) / f"{host}.out").read_text()


def test_mdadm_conf_line_rendered(render_run):
    layout = _mdadm_layout()
    text = render(render_run, "mdadm-conf")
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert lines == [f"ARRAY /dev/md/data metadata=1.2 UUID={layout['md_uuid']}"]


def test_udev_rule_rendered_for_md_and_btrfs(render_run):
    md = _udev_md_layout()
    rules = [ln for ln in render(render_run, "udev-md").splitlines() if ln and not ln.startswith("#")]
    assert rules == [
        'ACTION=="add|change", SUBSYSTEM=="block", ENV{DEVTYPE}=="disk", ATTRS{wwid}=="eui.0025384b21406c01", '
        'ATTR{queue/scheduler}="none"',
        'ACTION=="add|change", SUBSYSTEM=="block", ENV{DEVTYPE}=="disk", ATTRS{serial}=="S7KGNU0X100002", '
        'ATTR{queue/scheduler}="none"',
        'ACTION=="add|change", SUBSYSTEM=="block", KERNEL=="md*", ENV{DEVTYPE}=="disk", '
        'IMPORT{program}="/sbin/mdadm --detail --no-devices --export $devnode"',
        f'ACTION=="add|change", SUBSYSTEM=="block", KERNEL=="md*", ENV{{MD_UUID}}=="{md["md_uuid"]}", '
        'ATTR{queue/read_ahead_kb}="4096"',
    ]
    rules = [ln for ln in render(render_run, "udev-loops").splitlines() if ln and not ln.startswith("#")]
    assert rules == [
        f'ACTION=="add|change", SUBSYSTEM=="block", ENV{{DEVTYPE}}=="disk", KERNEL=="{k}", '
        'ATTR{queue/read_ahead_kb}="4096"' for k in ("loop0", "loop1")
    ]


def test_plan_file_rendered_with_the_commands(render_run):
    layout = _plan_layout()
    text = render(render_run, "gpu1")
    assert text.splitlines()[0] == (
        "# provisioner role storage on gpu1: skipped: no md driver in this kernel (/proc/mdstat absent) - nothing "
        "was created")
    assert "layout:     mdadm raid0 (/dev/md/data, chunk 512 KiB, XFS su=512k sw=2)" in text
    assert f"  {B} (/dev/nvme1n1): 4000.0 GB, wiped first (storage_wipe_devices), held an ext4 filesystem (label old)" in text
    commands = text.split("commands:\n", 1)[1].split("/etc/fstab:", 1)[0].splitlines()
    assert commands == [
        f"  wipefs --all {B}",
        f"  mdadm --create /dev/md/data --run --metadata=1.2 --level=raid0 --raid-devices=2 --chunk=512 --name=data "
        f"--homehost=gpu1 --uuid={layout['md_uuid']} {A} {B}",
        f"  mkfs.xfs -f -L data -m uuid={layout['fs_uuid']} -d su=512k,sw=2 /dev/md/data",
    ]
    assert f"  {layout['fstab_line']}" in text
    assert f"/etc/mdadm/mdadm.conf (then update-initramfs -u):\n  ARRAY /dev/md/data metadata=1.2 UUID={layout['md_uuid']}" in text
    assert "ENV{MD_UUID}" in text




# --------------------------------------------------------------------------
# the role's own array, degraded: a lost drive, its return, a replacement
# --------------------------------------------------------------------------

U1 = "aaaaaaaa:bbbbbbbb:cccccccc:dddddddd"
XFS1 = {"kind": "xfs", "uuid": "5e1f0000-0000-4000-8000-0000000000aa"}


def _degraded(slaves=("nvme0n1",), level="raid1", disks=2, **extra):
    return {"md127": {"device": "/dev/md127", "level": level, "raid_disks": disks, "chunk_kb": 0 if level == "raid1" else 512,
                      "slaves": list(slaves), "majmin": "9:127", "state": "clean", "degraded": disks - len(slaves),
                      "sync_action": "idle", "filesystem": XFS1, **extra}}


def _running(kname, id_, role, level="raid1", disks=2):
    return member(kname, id_, holders=["md127"], **_md(U1, role, level=level, disks=disks, fs=XFS1))


def test_a_degraded_array_with_its_drive_gone_is_kept_and_warned_about():
    r = ps.decide(spec("raid1"), [_running("nvme0n1", A, 0)], _degraded(), missing=[B], named="md127")
    assert r["refusals"] == [] and r["action"] == "adopt" and r["commands"] == []
    assert r["fs_uuid"] == XFS1["uuid"] and r["md_uuid"] == U1 and r["fs_device"] == "/dev/md127"
    assert r["degraded"]["missing"] == [B] and (r["degraded"]["active"], r["degraded"]["raid_disks"]) == (1, 2)
    assert r["warnings"] == [
        f"storage: the data array /dev/md/data (raid1) runs degraded on 1 of 2 drives, {B} not on this host {SEP} put "
        "the drive back, or list a blank drive in its place in storage_devices, then run up again"]


def test_a_returning_member_is_re_added_else_added():
    back = member("nvme4n1", B, **_md(U1, 1, fs=XFS1))
    r = ps.decide(spec("raid1"), [_running("nvme0n1", A, 0), back], _degraded(), named="md127")
    assert r["refusals"] == [] and r["action"] == "repair" and r["warnings"] == []
    assert r["commands"] == [{"argv": ["mdadm", "/dev/md127", "--re-add", B], "fallback": ["mdadm", "/dev/md127", "--add", B],
                              "why": f"re-add {B}, a member of the degraded array {U1}"}]
    assert r["degraded"]["returning"] == [B] and r["fs_uuid"] == XFS1["uuid"]
    assert r["mount"]["src"] == f"UUID={XFS1['uuid']}"


def test_a_blank_drive_in_place_of_the_lost_one_is_added_as_the_replacement():
    r = ps.decide(spec("raid10"), [_running("nvme0n1", A, 0, "raid10", 4), _running("nvme1n1", B, 1, "raid10", 4),
                                   _running("nvme3n1", D, 3, "raid10", 4), member("nvme5n1", C)],
                  _degraded(("nvme0n1", "nvme1n1", "nvme3n1"), "raid10", 4), named="md127")
    assert r["refusals"] == [] and r["action"] == "repair"
    assert [c["argv"] for c in r["commands"]] == [["mdadm", "/dev/md127", "--add", C]]
    assert "fallback" not in r["commands"][0] and r["stripe_width"] == 2


def test_a_drive_holding_other_data_is_refused_as_the_replacement_unless_it_may_be_wiped():
    other = member("nvme5n1", C, signatures=[{"type": "ext4", "uuid": "1234"}])
    r = ps.decide(spec("raid1"), [_running("nvme0n1", A, 0), other], _degraded(), named="md127")
    assert r["action"] == "refuse" and r["refusals"] == [
        f"storage: refusing {C} (/dev/nvme5n1) as a replacement in the degraded array /dev/md/data ({U1}): it holds an "
        f"ext4 filesystem (UUID 1234), and only a returning member of that array or a blank drive is added {SEP} add it "
        "to storage_wipe_devices to allow wiping it, or list another drive"]
    foreign_md = member("nvme5n1", C, **_md("99999999:99999999:99999999:99999999", 1, level="raid1"))
    assert "holds an md RAID member signature" in ps.decide(
        spec("raid1"), [_running("nvme0n1", A, 0), foreign_md], _degraded(), named="md127")["refusals"][0]
    other["wipe_allowed"] = True
    r = ps.decide(spec("raid1"), [_running("nvme0n1", A, 0), other], _degraded(), named="md127")
    assert [c["argv"] for c in r["commands"]] == [["wipefs", "--all", C], ["mdadm", "/dev/md127", "--add", C]]


def test_a_degraded_array_of_another_layout_is_not_repaired_into_the_request():
    drives = [_running("nvme0n1", A, 0), member("nvme1n1", B)]
    # raid10 requested over an array that is raid1: the normal decision, which refuses the held drive
    r = ps.decide(spec("raid10"), [*drives, member("nvme2n1", C), member("nvme3n1", D)], _degraded(), named="md127")
    assert r["action"] == "refuse" and "in use by md127" in r["refusals"][0]
    # as many drives as the array has slots, but the array also runs on a drive that is not listed
    r = ps.decide(spec("raid1"), drives, _degraded(("nvme0n1", "nvme9n1"), disks=3), named="md127")
    assert r["action"] == "refuse"
    # not the role's array (no /dev/md/NAME link to it)
    assert ps.decide(spec("raid1"), drives, _degraded())["action"] == "refuse"


def test_a_repaired_array_rebuilding_its_member_is_adopted_as_it_is():
    drives = [_running("nvme0n1", A, 0), _running("nvme4n1", B, 1)]
    arrays = _degraded(("nvme0n1", "nvme4n1"), sync_action="recover", degraded=1)
    r = ps.decide(spec("raid1"), drives, arrays, named="md127")
    assert r["action"] == "adopt" and r["commands"] == [] and r["warnings"] == [] and "degraded" not in r


def test_a_missing_drive_is_a_degraded_member_only_beside_the_roles_degraded_array(fake_root):
    root = Path(fake_root)
    (root / "sys/block/md127/md").mkdir(parents=True)
    for rel, text in {"md/level": "raid1", "md/raid_disks": "2", "md/degraded": "1", "md/array_state": "clean",
                      "md/sync_action": "idle", "md/chunk_size": "0", "dev": "9:127"}.items():
        (root / "sys/block/md127" / rel).write_text(text + "\n")
    (root / "sys/block/md127/slaves").mkdir()
    (root / "sys/block/md127/slaves/nvme0n1").symlink_to("../../nvme0n1")
    (root / "sys/block/nvme0n1/holders").mkdir()
    (root / "sys/block/nvme0n1/holders/md127").symlink_to("../../md127")
    gone = "/dev/disk/by-id/nvme-Samsung_S7KGNU0X100002"
    params: dict[str, Any] = {"devices": ["/dev/disk/by-id/nvme-Samsung_S7KGNU0X100001", gone], "level": "raid1", "backend": "mdadm"}
    r = ps.gather(params, root=fake_root, probe=False)
    assert r["refusals"] == [f"storage: {gone} does not exist on this host (see ls -l /dev/disk/by-id)"]
    (root / "dev/md").mkdir()
    (root / "dev/md/data").symlink_to("../md127")
    arrays = ps.drives.md_arrays(fake_root)
    assert arrays["md127"]["degraded"] == 1 and ps.drives.named_array(fake_root, "data", arrays) == "md127"
    r = ps.gather(params, root=fake_root, probe=False)
    assert r["missing"] == [gone]
    r = ps.gather({**params, "devices": params["devices"] + ["serial:NOPE"]}, root=fake_root, probe=False)
    assert r["missing"] == [] and len(r["refusals"]) == 2  # three drives named for a two-drive array


def test_an_old_arrays_fstab_line_is_replaced_when_its_drives_are_wiped():
    r = ps.decide(spec("raid10"), [member(k, i) for k, i in (("nvme0n1", A), ("nvme1n1", B), ("nvme2n1", C), ("nvme3n1", D))])
    old = ps.parse_fstab(f"UUID={XFS1['uuid']} /data xfs noatime,nofail 0 0\n")
    assert ps.foreign_fstab_entries(old, r, root="/nonexistent") == [old[0]["line"]]
    r["replaced_filesystems"] = [XFS1["uuid"]]
    assert ps.foreign_fstab_entries(old, r, root="/nonexistent") == []


@pytest.mark.parametrize(
    ("cli", "made"),
    [
        # site.yml's input check of a run with common's configure phase: common creates the ML group later.
        (["--tags", "storage,common_configure"], {"input": True, "other-group": False, "role-play": False}),
        ([], {"input": True, "other-group": False, "role-play": False}),
        # Without common in the run nothing creates the group: the missing group is refused up front.
        (["--tags", "storage"], {"input": False, "other-group": False, "role-play": False}),
        (["--skip-tags", "common_configure"], {"input": False, "other-group": False, "role-play": False}),
    ],
)
def test_the_ml_group_counts_as_present_only_in_the_input_check_of_a_run_that_creates_it(tmp_path_factory, cli, made):
    from playbook_cases import local_env, local_host, run_cases

    hosts = {
        "input": {"provisioner_input_check": True, "storage_owner_group": "ml"},
        "other-group": {"provisioner_input_check": True, "storage_owner_group": "data-team"},
        "role-play": {"storage_owner_group": "ml"},
    }
    play = [{
        "hosts": "all", "gather_facts": False,
        "tasks": [
            {"ansible.builtin.include_vars": str(ROLE / "vars" / "main.yml"), "tags": ["always"]},
            {"name": "Show", "ansible.builtin.debug": {"msg": "made={{ _storage_group_made_in_this_run | bool }}"},
             "tags": ["always"]},
        ],
    }]
    # --tags and --skip-tags are the run's: one run per row.
    run = run_cases(tmp_path_factory, "storage-ml-group", play, {h: local_host(v) for h, v in hosts.items()}, args=cli,
                    env=lambda workdir: local_env(ANSIBLE_FILTER_PLUGINS=str(ROLE.parents[1] / "plugins" / "filter")))
    assert run.returncode == 0, run.tail()
    shown = {host: dict(run.results(host))["Show"]["msg"] for host in hosts}
    assert shown == {host: f"made={value}" for host, value in made.items()}
