"""The storage proposal: which drives are free, the level and backend, the layout
(docs/tuning.md, 'Storage').  Never confirmed here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from provisioner.constants import MD_CHUNK_KB, MIN_DRIVES, READ_AHEAD_KB
from provisioner.module_utils import load
from provisioner.plan.base import PlanError, _get, _human_bytes
from provisioner.plan.options import PlanOptions

rules = load("provisioner_drive_rules")


def stable_id(device: Mapping[str, Any]) -> tuple[str, bool]:
    """The name to use for a drive: a /dev/disk/by-id link (facts sort them best first), else the
    kernel path.  Returns (path, stable).  See docs/tuning.md, 'Which drives'."""
    by_id = [link for link in device.get("by_id") or [] if "-part" not in link]
    if by_id:
        return by_id[0], True
    return device.get("path") or f"/dev/{device['name']}", False


# The plan's words for each finding of the shared rules (plugins/module_utils/provisioner_drive_rules.py).
_WORDS = {
    "root": lambda detail: "root disk: holds /, /boot or /boot/efi",
    "mounted": lambda detail: f"mounted at {', '.join(detail or ['?'])}",
    "held": lambda detail: f"in use by {', '.join(detail)}",
    "partitions": lambda detail: f"has partitions ({', '.join(detail)})",
    "signatures": lambda detail: f"has a signature ({', '.join(detail)}): may hold data",
    "unprobed": lambda detail: "could not be probed for signatures (blkid -p failed): may hold data",
    "read_only": lambda detail: "read-only",
    "removable": lambda detail: "removable",
}


def exclusion_reason(device: Mapping[str, Any], explicit: bool = False) -> str | None:
    """Why a drive is not free for a new data array, or None when it is: the first finding of the
    rules the storage module shares, then (unless named) loop and non-NVMe drives, then size 0.
    See docs/tuning.md, 'Which drives'."""
    found = rules.findings(device)
    for kind, detail in found:
        if kind != "empty":
            return str(_WORDS[kind](detail))
    if not explicit:
        if device.get("loop"):
            return "loop device (name it in plan_storage_devices to use it)"
        if not device.get("nvme"):
            kind = "rotational" if device.get("rotational") else "SATA/SAS/virtual"
            return f"not NVMe ({kind}; name it in plan_storage_devices to use it)"
    if found:
        return "size 0"
    return None


def _only_at(device: Mapping[str, Any], mountpoint: str) -> bool:
    """Mounted at the data mountpoint and nowhere else."""
    points = [str(p).rstrip("/") or "/" for p in device.get("mountpoints") or []]
    return points == [mountpoint.rstrip("/") or "/"]


def _whole(device: Mapping[str, Any]) -> bool:
    return not device.get("root_disk") and not device.get("partitions")


def own_array(devices: list[Mapping[str, Any]], mountpoint: str, backend: str, level: str) -> set[str]:
    """Kernel names of the drives of the data array already mounted at the data mountpoint, the one
    an earlier run of this proposal built (see docs/storage.md, 'Re-running'): proposed again as they
    are, so that the storage role adopts the array and changes nothing.  Empty when something else is
    mounted there.

    btrfs: the drive the mount table names is mounted there; its fellow members are not, but carry
    the same filesystem UUID (facts: lsblk, blkid -p, /sys/fs/btrfs).  md: every member shows the
    array's mountpoint through its one md holder.  mdadm single: XFS on the drive itself."""
    at = [d for d in devices if _only_at(d, mountpoint) and _whole(d)]
    if backend == "btrfs":
        uuids = {d.get("uuid") for d in at if not d.get("holders") and set(d.get("signatures") or []) == {"btrfs"}}
        if len(uuids) != 1 or None in uuids:
            return set()
        (uuid,) = uuids
        return {
            d["name"]
            for d in devices
            if d.get("uuid") == uuid
            and _whole(d)
            and not d.get("holders")
            and set(d.get("signatures") or []) == {"btrfs"}
            and (not d.get("mountpoints") or _only_at(d, mountpoint))
        }
    if level == "single":
        found = [d for d in at if not d.get("holders") and set(d.get("signatures") or []) == {"xfs"}]
        return {found[0]["name"]} if len(found) == 1 else set()
    members = [
        d
        for d in at
        if len(d.get("holders") or []) == 1
        and str(d["holders"][0]).startswith("md")
        and all(s == "linux_raid_member" or str(s).startswith("raid") for s in d.get("signatures") or [])
    ]
    if len({d["holders"][0] for d in members}) != 1:
        return set()
    return {d["name"] for d in members}


def _as_unused(device: Mapping[str, Any]) -> dict[str, Any]:
    """A drive of the existing data array judged without what that array puts on it (its mount, its
    md holder, its signatures): every other reason still counts."""
    return {**device, "mounted": False, "mountpoints": [], "holders": [], "signatures": []}


def _find_device(devices: list[Mapping[str, Any]], wanted: str) -> Mapping[str, Any] | None:
    bare = wanted[len("/dev/") :] if wanted.startswith("/dev/") and "/" not in wanted[5:] else None
    for device in devices:
        names = {device.get("path"), device.get("name"), *(device.get("by_id") or [])}
        if wanted in names or (bare and bare == device.get("name")):
            return device
    return None


def plan_storage(facts: Mapping[str, Any], options: PlanOptions, warnings: list[str]) -> dict[str, Any]:
    """A proposal for the data array.  Never confirmed here: the storage role builds nothing
    until the user confirms; drives in any use are never proposed.  See docs/tuning.md,
    'Storage' ('Which drives', 'Level and backend', 'Layout')."""
    devices = list(_get(facts, "block_devices", []) or [])
    level, backend = options.storage_level, options.storage_backend
    excluded: list[dict[str, Any]] = []
    candidates: list[Mapping[str, Any]] = []
    own = own_array(devices, options.data_mountpoint, backend, level)

    if options.storage_devices:
        for wanted in options.storage_devices:
            device = _find_device(devices, wanted)
            if device is None:
                raise PlanError(f"plan_storage_devices: {wanted} is not a block device on this host")
            why = exclusion_reason(_as_unused(device) if device["name"] in own else device, explicit=True)
            if why:
                raise PlanError(f"plan_storage_devices: refusing {wanted}: {why}")
            candidates.append(device)
        for device in devices:
            if device not in candidates and not device.get("loop"):
                why = exclusion_reason(device) or "not in plan_storage_devices"
                excluded.append({"name": device["name"], "path": device.get("path"), "reason": why})
    else:
        # Loop devices are files, not drives: never proposed, and not worth listing (they come
        # and go with other software on the host, which would make the plan itself change).
        listed = [d for d in devices if not d.get("loop")]
        # The data array already there is the proposal: other free drives are not added to it.
        others = (
            f"not a drive of the data array already at {options.data_mountpoint}" if own & {d["name"] for d in listed} else None
        )
        for device in listed:
            why = exclusion_reason(_as_unused(device)) if device["name"] in own else exclusion_reason(device) or others
            if why:
                excluded.append({"name": device["name"], "path": device.get("path"), "reason": why})
            else:
                candidates.append(device)

    candidates.sort(key=lambda d: stable_id(d)[0])
    if level == "single" and backend == "mdadm" and len(candidates) > 1:
        for device in candidates[1:]:
            excluded.append({"name": device["name"], "path": device.get("path"), "reason": "level single uses one drive"})
        candidates = candidates[:1]

    filesystem = "btrfs" if backend == "btrfs" else "xfs"
    proposal: dict[str, Any] = {
        "proposed": False,
        "confirmed": False,
        "level": level,
        "backend": backend,
        "filesystem": filesystem,
        "chunk_kb": MD_CHUNK_KB if backend == "mdadm" and level != "single" else None,
        "mountpoint": options.data_mountpoint,
        "mount_options": ["noatime", "nofail"],
        "read_ahead_kb": READ_AHEAD_KB,
        "scheduler": "none",
        "devices": [],
        "excluded": excluded,
        "usable_bytes": 0,
        "existing": False,
        "reason": "",
    }
    need = MIN_DRIVES[level]
    if len(candidates) < need:
        found = (
            f"{len(candidates)} unused NVMe data drive(s)" if not options.storage_devices else f"{len(candidates)} drive(s) named"
        )
        proposal["reason"] = f"nothing proposed: {level} needs {need} drive(s), found {found}"
        return proposal

    members = []
    for device in candidates:
        path, stable = stable_id(device)
        if not stable:
            warnings.append(f"{device['name']} has no /dev/disk/by-id link; its kernel name may change across reboots")
        members.append(
            {"id": path, "name": device["name"], "size_bytes": device.get("size_bytes", 0), "model": device.get("model")}
        )
    sizes = [m["size_bytes"] for m in members]
    smallest = min(sizes)
    if max(sizes) > 1.1 * smallest:
        warnings.append(f"data drives differ in size; {level} uses {_human_bytes(smallest)} of each")
    if backend == "mdadm":
        usable = {
            "raid0": smallest * len(members),
            "raid1": smallest,
            "raid10": smallest * len(members) // 2,
            "single": smallest,
        }[level]
    else:  # btrfs allocates per chunk, so unequal drives are used in full (roughly)
        usable = sum(sizes) if level in ("raid0", "single") else sum(sizes) // 2
    why_level = {
        "raid0": "RAID0 for rebuildable scratch: ~2x bandwidth and capacity, one failure loses it (mdadm(8))",
        "raid1": "RAID1: survives one drive failure, for data that cannot be rebuilt (mdadm(8))",
        "raid10": "RAID10: striped mirrors (mdadm(8))",
        "single": "single: no redundancy, no striping",
    }[level]
    layout = (
        f"mdadm {level}, chunk {MD_CHUNK_KB} KiB, XFS (mkfs.xfs reads md geometry), mount noatime,nofail (RHEL XFS docs)"
        if backend == "mdadm"
        else f"btrfs data {level}, metadata {'raid1' if len(members) > 1 else 'dup'}, mount noatime,nofail"
    )
    if backend == "mdadm" and level == "single":
        layout = "XFS directly on the drive, mount noatime,nofail (RHEL XFS docs)"
    if backend == "btrfs":
        proposal["metadata_profile"] = "raid1" if len(members) > 1 else "dup"
    what = "drive(s) from plan_storage_devices" if options.storage_devices else "unused NVMe drive(s)"
    existing = all(m["name"] in own for m in members)
    if existing:
        what = f"drive(s) of the data array already at {options.data_mountpoint} (the storage role adopts it)"
    proposal.update(
        proposed=True,
        existing=existing,
        devices=members,
        usable_bytes=usable,
        reason=(
            f"proposal only, not confirmed: {len(members)} {what} -> {options.data_mountpoint} "
            f"({_human_bytes(usable)}); {why_level}; {layout}"
        ),
    )
    return proposal
