"""The drive rules the plan and the storage module share (plugins/module_utils/provisioner_drive_rules.py):
the findings on their own, and one table of drives judged by both readers, the plan (facts, on the
control node) and the storage module (its inspection, on the target). Where they still disagree,
KNOWN_DISAGREEMENTS says so and why; a fix deletes its entry (and the test fails until it does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import plugin_code
import pytest
from facts_fixtures import load
from fake_tree import write

from provisioner.module_utils import load as load_module_utils
from provisioner.plan import PlanError, PlanOptions, derive_plan

rules = load_module_utils("provisioner_drive_rules")
ps = plugin_code.load("modules", "provisioner_storage")
pf = plugin_code.load("modules", "provisioner_facts")

FSID = "5e0b7c1a-1111-4c2d-9e3f-abcdefabcdef"
MOUNTPOINT = "/scratch"


def test_the_plan_and_the_module_load_the_same_rules():
    module_rules = plugin_code.load("module_utils", "provisioner_drive_rules")
    assert module_rules.KINDS == rules.KINDS
    assert ps.drive_rules.findings.__code__.co_code == rules.findings.__code__.co_code


def test_findings_in_order_for_both_shapes():
    facts_drive = {"root_disk": True, "mountpoints": ["/"], "partitions": ["sda1"], "signatures": ["gpt", "ext4"],
                   "signature_probe": "failed", "read_only": True, "removable": True, "size_bytes": 0}
    assert [kind for kind, _ in rules.findings(facts_drive)] == [
        "root", "mounted", "partitions", "signatures", "unprobed", "read_only", "removable", "empty"]
    module_drive = {"mountpoints": [], "holders": ["md127"], "signatures": [{"type": "linux_raid_member"}, {"type": None}],
                    "probe_error": "blkid -p failed: x", "size_bytes": 1}
    assert rules.findings(module_drive) == [
        ("held", ["md127"]), ("signatures", ["linux_raid_member", "unknown"]), ("unprobed", "blkid -p failed: x")]
    # A superblock only the module's raw reads saw still counts as contents.
    raw = {"size_bytes": 1, "xfs": {"uuid": "u", "label": ""}}
    assert rules.findings(raw) == [("signatures", ["xfs"])] and rules.has_contents(raw)
    assert rules.findings({"size_bytes": 1}) == [] and not rules.has_contents({"size_bytes": 1})


# --------------------------------------------------------------------------
# one table of drives, both readers
# --------------------------------------------------------------------------

# name -> the drive: mountpoints, holders, partitions, sig (its one signature), uuid, probe_failed,
# read_only, removable, size
CASES: dict[str, dict[str, Any]] = {
    "blank": {},
    "mounted-elsewhere": {"mountpoints": ["/srv"], "sig": "ext4"},
    "root-disk": {"mountpoints": ["/"], "partitions": ["loop5p1"], "sig": "gpt"},
    "md-member": {"holders": ["md127"], "sig": "linux_raid_member"},
    "partitions": {"partitions": ["loop5p1"], "sig": "gpt"},
    "ext4": {"sig": "ext4"},
    "probe-failed": {"probe_failed": True},
    "read-only": {"read_only": True},
    "size-0": {"size": 0},
    "removable": {"removable": True},
    # Case 1 (storage-plan §1): the XFS of level single that an earlier run built, mounted at the
    # data mountpoint: the plan proposes it again, the module adopts it.
    "converged-xfs-at-the-mountpoint": {"mountpoints": [MOUNTPOINT], "sig": "xfs", "uuid": FSID},
    "xfs-not-mounted": {"sig": "xfs", "uuid": FSID},
}

# case -> (the plan's verdict, the module's verdict), and why they differ.
KNOWN_DISAGREEMENTS = {
    # Case 2: the plan leaves removable drives out, the module never reads `removable`.
    "removable": ("refuse", "use"),
    # Case 1, unmounted: the plan knows its array only by the mount at plan_data_mountpoint; the
    # module adopts (and mounts) an XFS it finds on the one drive of single.
    "xfs-not-mounted": ("refuse", "use"),
}


def _facts_drive(case: dict[str, Any]) -> dict[str, Any]:
    points = case.get("mountpoints", [])
    return {
        "name": "loop5",
        "path": "/dev/loop5",
        "size_bytes": case.get("size", 1 << 30),
        "by_id": [],
        "nvme": False,
        "loop": True,
        "type": "loop",
        "root_disk": any(p in ("/", "/boot", "/boot/efi") for p in points),
        "mounted": bool(points),
        "mountpoints": points,
        "holders": case.get("holders", []),
        "partitions": case.get("partitions", []),
        "signatures": [case["sig"]] if case.get("sig") else [],
        "signature_probe": "failed" if case.get("probe_failed") else "ok",
        "read_only": case.get("read_only", False),
        "removable": case.get("removable", False),
        "uuid": case.get("uuid"),
    }


def _module_drive(case: dict[str, Any]) -> dict[str, Any]:
    sig = case.get("sig")
    return {
        "kname": "loop5",
        "id": "/dev/loop5",
        "path": "/dev/loop5",
        "cmd_path": "/dev/loop5",
        "by_id": [],
        "size_bytes": case.get("size", 1 << 30),
        "read_only": case.get("read_only", False),
        "serial": None,
        "wwid": None,
        "model": None,
        "nvme": False,
        "loop": True,
        "backing_file": "/var/tmp/loop5.img",
        "scheduler": "none",
        "read_ahead_kb": 128,
        "partitions": case.get("partitions", []),
        "holders": case.get("holders", []),
        "mountpoints": case.get("mountpoints", []),
        "signatures": [{"type": sig, "label": None, "uuid": case.get("uuid"), "offset": "0x0"}] if sig else [],
        "probe_error": "blkid -p failed: exit 4" if case.get("probe_failed") else None,
        "btrfs": None,
        "md": None,
        "xfs": {"uuid": case["uuid"], "label": ""} if sig == "xfs" else None,
        "wipe_allowed": False,
    }


def plan_verdict(case: dict[str, Any]) -> str:
    facts = {**load("epyc_4545p"), "block_devices": [_facts_drive(case)]}
    options = PlanOptions(storage_devices=("/dev/loop5",), storage_level="single", data_mountpoint=MOUNTPOINT)
    try:
        storage = derive_plan(facts, options).storage
        assert storage is not None
    except PlanError:
        return "refuse"
    return "use" if storage["proposed"] else "refuse"


def module_verdict(case: dict[str, Any]) -> str:
    spec = {"level": "single", "backend": "mdadm", "md_name": "data", "chunk_kb": 512, "mountpoint": MOUNTPOINT,
            "hostname": "gpu1"}
    at_mountpoint = MOUNTPOINT in case.get("mountpoints", [])
    state = {"exists": True, "mounted": True, "mounted_source": "/dev/loop5", "mounted_fstype": "xfs"} if at_mountpoint else {}
    result = ps.decide(spec, [_module_drive(case)], mountpoint_state=state)
    return "refuse" if result["action"] == "refuse" else "use"


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_plan_and_the_module_agree_on_each_drive(name):
    verdicts = (plan_verdict(CASES[name]), module_verdict(CASES[name]))
    if name in KNOWN_DISAGREEMENTS:
        assert verdicts == KNOWN_DISAGREEMENTS[name], f"{name}: fixed? delete it from KNOWN_DISAGREEMENTS"
        assert verdicts[0] != verdicts[1]
    else:
        assert verdicts[0] == verdicts[1], f"{name}: plan {verdicts[0]}, module {verdicts[1]}"


# --------------------------------------------------------------------------
# the ids each reader accepts (cases 3 and 4), on one fake /sys and /dev
# --------------------------------------------------------------------------


@pytest.fixture
def id_tree(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    for name, majmin in (("nvme1n1", "259:3"), ("dm-0", "253:0")):
        write(root, f"/sys/block/{name}/dev", f"{majmin}\n")
        write(root, f"/sys/block/{name}/size", "7501476528\n")
        (root / f"sys/block/{name}/holders").mkdir(parents=True, exist_ok=True)
    write(root, "/sys/block/nvme1n1/device/serial", "S64H1\n")
    write(root, "/sys/block/nvme1n1/wwid", "eui.0001\n")
    write(root, "/proc/self/mountinfo", "")
    by_id = root / "dev" / "disk" / "by-id"
    by_id.mkdir(parents=True)
    (by_id / "nvme-SAMSUNG_S64H1").symlink_to("../../nvme1n1")
    (by_id / "nvme-eui.0001").symlink_to("../../nvme1n1")
    (by_id / "dm-name-vg-lv").symlink_to("../../dm-0")
    return root


ID_CASES = {
    "by-id": "/dev/disk/by-id/nvme-SAMSUNG_S64H1",
    "kernel-name": "/dev/nvme1n1",
    "serial": "serial:S64H1",
    "wwn": "wwn:eui.0001",
    "dm-by-id": "/dev/disk/by-id/dm-name-vg-lv",
}

KNOWN_ID_DISAGREEMENTS = {
    # Case 3: the plan looks names up among paths, kernel names and by-id links only.
    "serial": ("refuse", "use"),
    "wwn": ("refuse", "use"),
    # Case 4: the facts never list dm-*/md* devices as drives; the module takes any /sys/block entry.
    "dm-by-id": ("refuse", "use"),
}


@pytest.mark.parametrize("name", sorted(ID_CASES))
def test_the_plan_and_the_module_accept_the_same_ids(id_tree, name):
    wanted = ID_CASES[name]
    devices = pf.gather_block_devices(str(id_tree))
    facts = {**load("epyc_4545p"), "block_devices": devices}
    try:
        derive_plan(facts, PlanOptions(storage_devices=(wanted,), storage_level="single"))
        plan = "use"
    except PlanError:
        plan = "refuse"
    kname, _why = ps.drives.resolve(wanted, root=str(id_tree), allow_unstable=True)
    verdicts = (plan, "use" if kname else "refuse")
    if name in KNOWN_ID_DISAGREEMENTS:
        assert verdicts == KNOWN_ID_DISAGREEMENTS[name], f"{name}: fixed? delete it from KNOWN_ID_DISAGREEMENTS"
    else:
        assert verdicts == ("use", "use"), name


def test_the_name_each_reader_gives_a_drive_named_by_serial(id_tree):
    """Case 7, kept: both list the same links (provisioner_drives.by_id_links), the facts best first,
    while the module names a serial:/wwn: drive in its commands, fstab device= and udev rule by the
    alphabetically first link, as on every host it has built so far."""
    facts_links = {d["name"]: d["by_id"] for d in pf.gather_block_devices(str(id_tree))}["nvme1n1"]
    assert facts_links == ["/dev/disk/by-id/nvme-eui.0001", "/dev/disk/by-id/nvme-SAMSUNG_S64H1"]
    params = {"devices": ["serial:S64H1"], "level": "single", "backend": "mdadm", "mountpoint": "/data"}
    (member,) = ps.gather(params, root=str(id_tree), probe=False)["members"]
    assert member["cmd_path"] == "/dev/disk/by-id/nvme-SAMSUNG_S64H1" != facts_links[0]
    assert member["by_id"] == sorted(facts_links)
