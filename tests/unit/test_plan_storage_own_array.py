"""The plan on a host where its own proposal already built the data array: the facts of the converged
host (lsblk's JSON, or the /sys tree with /sys/fs/btrfs, as provisioner_facts reads them) give the
same proposal as the first run, marked existing, so the storage role adopts the array; anything
else mounted at the data mountpoint, or the drives of another array, are still refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import plugin_code
import pytest
from facts_fixtures import load

from provisioner.plan import PlanError, PlanOptions
from provisioner.plan import derive_plan as _derive_plan
from provisioner.plan.storage import own_array

pf = plugin_code.load("modules", "provisioner_facts")
dl = sys.modules[pf.gather_block_devices.__module__]  # provisioner_drive_list: the block devices

FSID = "0b3f6a7e-55c1-4d0b-9f0e-3c2a1d4e5f60"
OTHER_FSID = "7d1c2b3a-0000-4a4a-8b8b-112233445566"
MD_UUID = "3c9a1f0e-2b7d-4e61-a0c3-5d8e9f7a6b21"
SIZE = 1 << 30
NAMED = PlanOptions(storage_devices=("/dev/loop0", "/dev/loop1"), storage_backend="btrfs", data_mountpoint="/scratch")
NAMED_MD = PlanOptions(storage_devices=("/dev/loop0", "/dev/loop1"), data_mountpoint="/scratch")


def _node(name, kind="loop", size=SIZE, fstype=None, uuid=None, mountpoints=(None,), majmin="7:0", children=()):
    node = {
        "name": name,
        "kname": name,
        "path": f"/dev/{name}",
        "maj:min": majmin,
        "type": kind,
        "size": size,
        "fstype": fstype,
        "uuid": uuid,
        "pttype": None,
        "mountpoints": list(mountpoints),
        "rota": False,
        "rm": False,
        "ro": False,
        "model": None,
        "serial": None,
        "wwn": None,
        "tran": None,
    }
    if children:
        node["children"] = list(children)
    return node


def _root_disk():
    part = _node("vda1", kind="part", size=SIZE * 9, fstype="ext4", uuid="r", mountpoints=["/"], majmin="254:1")
    return _node("vda", kind="disk", size=SIZE * 10, majmin="254:0", children=[part])


def derive_plan(facts: dict, options: PlanOptions):
    """The plan of a host with the epyc fixture's CPU and memory and these drives."""
    return _derive_plan({**load("epyc_4545p"), "block_devices": facts["block_devices"]}, options)


def _facts(*nodes, root_disk=True) -> dict:
    devices = dl.parse_lsblk(json.dumps({"blockdevices": [_root_disk()] * root_disk + list(nodes)}))
    for device in devices:
        device.setdefault("signature_probe", "ok")
    return {"block_devices": devices}


def _same_proposal(first: dict, again: dict) -> None:
    assert again["proposed"] is True and again["existing"] is True and first["existing"] is False
    ignore = ("existing", "reason")
    assert {k: v for k, v in again.items() if k not in ignore} == {k: v for k, v in first.items() if k not in ignore}


# --------------------------------------------------------------------------
# btrfs
# --------------------------------------------------------------------------


def _blank_loops(root_disk=True) -> dict:
    return _facts(_node("loop0"), _node("loop1", majmin="7:1"), root_disk=root_disk)


def _btrfs_converged(mounted_fstype="btrfs", uuid0=FSID, uuid1=FSID) -> dict:
    """Debian 12's lsblk on a btrfs raid0 at /scratch: the mount table names loop0 as the source,
    loop1 shows only the filesystem UUID they share."""
    return _facts(
        _node("loop0", fstype=mounted_fstype, uuid=uuid0, mountpoints=["/scratch"]),
        _node("loop1", fstype="btrfs", uuid=uuid1, majmin="7:1"),
    )


def test_a_btrfs_built_from_the_proposal_is_proposed_again():
    first = derive_plan(_blank_loops(), NAMED).storage
    assert first["proposed"] is True
    facts = _btrfs_converged()
    assert own_array(facts["block_devices"], "/scratch", "btrfs", "raid0") == {"loop0", "loop1"}
    again = derive_plan(facts, NAMED).storage
    _same_proposal(first, again)
    assert "already at /scratch" in again["reason"]


def test_a_btrfs_proposed_again_without_naming_the_drives():
    options = PlanOptions(storage_backend="btrfs", data_mountpoint="/scratch")
    facts = _btrfs_converged()
    for device in facts["block_devices"]:
        if device["name"].startswith("loop"):
            device.update(loop=False, nvme=True, type="disk", name=device["name"].replace("loop", "nvme9n"))
    facts["block_devices"].append(
        {**facts["block_devices"][-1], "name": "nvme8n1", "path": "/dev/nvme8n1", "signatures": [], "uuid": None}
    )
    storage = derive_plan(facts, options).storage
    assert storage["proposed"] is True and storage["existing"] is True
    assert [d["name"] for d in storage["devices"]] == ["nvme9n0", "nvme9n1"]
    excluded = {e["name"]: e["reason"] for e in storage["excluded"]}
    assert excluded["nvme8n1"] == "not a drive of the data array already at /scratch"


@pytest.mark.parametrize(
    ("facts", "refused"),
    [
        (lambda: _btrfs_converged(mounted_fstype="ext4", uuid0="e"), "refusing /dev/loop0: mounted at /scratch"),
        (lambda: _btrfs_converged(uuid1=OTHER_FSID), r"refusing /dev/loop1: has a signature \(btrfs\)"),
        (
            lambda: _facts(
                _node("loop0", fstype="btrfs", uuid=FSID, mountpoints=["/srv"]),
                _node("loop1", fstype="btrfs", uuid=FSID, majmin="7:1"),
            ),
            "refusing /dev/loop0: mounted at /srv",
        ),
    ],
    ids=["another-filesystem-mounted-there", "member-of-another-btrfs", "mounted-elsewhere"],
)
def test_anything_else_is_still_refused(facts, refused):
    with pytest.raises(PlanError, match=refused):
        derive_plan(facts(), NAMED)


def test_btrfs_at_the_mountpoint_is_not_an_md_proposal():
    with pytest.raises(PlanError, match="refusing /dev/loop0: mounted at /scratch"):
        derive_plan(_btrfs_converged(), NAMED_MD)


def _write(root: Path, path: str, text: str = "") -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def _sysfs_host(tmp_path: Path, md: bool) -> Path:
    """The /sys and /proc of a converged host without lsblk or udev (a container): the mount's
    maj:min is btrfs's anonymous one, the members are listed under /sys/fs/btrfs."""
    root = tmp_path / "host"
    for name, majmin in (("loop0", "7:0"), ("loop1", "7:1")):
        _write(root, f"/sys/block/{name}/dev", f"{majmin}\n")
        _write(root, f"/sys/block/{name}/size", f"{SIZE // 512}\n")
        (root / f"sys/block/{name}/holders").mkdir(parents=True, exist_ok=True)
        if md:
            _write(root, f"/sys/block/{name}/holders/md127")
        else:
            _write(root, f"/sys/fs/btrfs/{FSID}/devices/{name}")
    _write(root, "/sys/fs/btrfs/features/raid1c34", "0\n")
    if md:
        _write(root, "/sys/block/md127/dev", "9:127\n")
        _write(root, "/sys/block/md127/size", f"{SIZE // 256}\n")
        _write(root, "/sys/block/md127/md/level", "raid0\n")
        mount = "30 1 9:127 / /scratch rw,noatime - xfs /dev/md127 rw\n"
    else:
        mount = "30 1 0:45 / /scratch rw,noatime - btrfs /dev/loop0 rw\n"
    _write(root, "/proc/self/mountinfo", mount)
    return root


def test_a_btrfs_seen_through_sys_is_proposed_again(tmp_path):
    devices = pf.gather_block_devices(str(_sysfs_host(tmp_path, md=False)))
    by_name = {d["name"]: d for d in devices}
    assert by_name["loop0"]["mountpoints"] == ["/scratch"] and by_name["loop1"]["mountpoints"] == []
    assert by_name["loop0"]["uuid"] == by_name["loop1"]["uuid"] == FSID
    assert by_name["loop0"]["signatures"] == by_name["loop1"]["signatures"] == ["btrfs"]
    again = derive_plan({"block_devices": devices}, NAMED).storage
    _same_proposal(derive_plan(_blank_loops(root_disk=False), NAMED).storage, again)


# --------------------------------------------------------------------------
# md
# --------------------------------------------------------------------------


def _md_converged(level="raid0", mountpoint="/scratch", holder="md127") -> dict:
    def member(name, majmin):
        array = _node(holder, kind=level, size=2 * SIZE, fstype="xfs", uuid="x", mountpoints=[mountpoint], majmin="9:127")
        return _node(name, fstype="linux_raid_member", uuid=MD_UUID, majmin=majmin, children=[array])

    return _facts(member("loop0", "7:0"), member("loop1", "7:1"))


def test_an_md_array_built_from_the_proposal_is_proposed_again():
    first = derive_plan(_blank_loops(), NAMED_MD).storage
    facts = _md_converged()
    assert own_array(facts["block_devices"], "/scratch", "mdadm", "raid0") == {"loop0", "loop1"}
    _same_proposal(first, derive_plan(facts, NAMED_MD).storage)


def test_an_md_array_seen_through_sys_is_proposed_again(tmp_path):
    devices = pf.gather_block_devices(str(_sysfs_host(tmp_path, md=True)))
    assert {d["name"]: d["holders"] for d in devices} == {"loop0": ["md127"], "loop1": ["md127"]}
    _same_proposal(
        derive_plan(_blank_loops(root_disk=False), NAMED_MD).storage, derive_plan({"block_devices": devices}, NAMED_MD).storage
    )


def test_members_of_another_md_array_are_refused():
    with pytest.raises(PlanError, match="refusing /dev/loop0: mounted at /srv"):
        derive_plan(_md_converged(mountpoint="/srv"), NAMED_MD)
    facts = _md_converged()
    facts["block_devices"][2]["holders"] = ["md126"]  # loop1 belongs to another array, also shown there
    with pytest.raises(PlanError, match="refusing /dev/loop0: mounted at /scratch"):
        derive_plan(facts, NAMED_MD)


def test_xfs_on_the_one_drive_of_single():
    options = PlanOptions(storage_devices=("/dev/loop0",), storage_level="single", data_mountpoint="/scratch")
    first = derive_plan(_facts(_node("loop0")), options).storage
    again = derive_plan(_facts(_node("loop0", fstype="xfs", uuid="u", mountpoints=["/scratch"])), options).storage
    _same_proposal(first, again)
    with pytest.raises(PlanError, match="refusing /dev/loop0: mounted at /scratch"):
        derive_plan(_facts(_node("loop0", fstype="ext4", uuid="u", mountpoints=["/scratch"])), options)
