# Copyright: provisioner contributors
# Apache License 2.0 (see pyproject.toml)
"""The block devices as provisioner_facts lists them for the plan (``block_devices``): lsblk's JSON,
or /sys/block where lsblk is missing, with mountinfo, /proc/swaps, the by-id links, blkid -p
(root only, unmounted drives) and /sys/fs/btrfs; which disks hold /, /boot or /boot/efi.

Runs on the target inside the module (standard library only, python3 3.8 and later); ``root``
other than "/" reads a fake tree and runs no commands.
"""

from __future__ import annotations

import glob
import json
import os
import re

# Siblings in the same module_utils package, by either name Ansible gives it (ansible.module_utils from the
# checkout, ansible_collections.provisioner.ml.plugins.module_utils installed). Absolute names only: Mitogen's module finder does not follow relative imports.
try:  # installed as the provisioner.ml collection
    from ansible_collections.provisioner.ml.plugins.module_utils import provisioner_common as common
    from ansible_collections.provisioner.ml.plugins.module_utils.provisioner_constants import SYSTEM_MOUNTPOINTS
    from ansible_collections.provisioner.ml.plugins.module_utils.provisioner_drive_rules import sort_by_id
    from ansible_collections.provisioner.ml.plugins.module_utils.provisioner_drives import by_id_links, parse_swaps, probe
except ImportError:  # run from the repository: ansible.cfg and the CLI put plugins/module_utils on the path
    from ansible.module_utils import provisioner_common as common  # type: ignore[no-redef]
    from ansible.module_utils.provisioner_constants import SYSTEM_MOUNTPOINTS
    from ansible.module_utils.provisioner_drive_rules import sort_by_id
    from ansible.module_utils.provisioner_drives import by_id_links, parse_swaps, probe


def _to_bool(value):
    """lsblk prints true/false (2.37+) or "1"/"0" (older); sysfs prints 1/0."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    return str(value).strip().lower() in ("1", "true", "yes")


def _clean(value):
    if value is None:
        return None
    value = str(value).strip()
    return value or None


# kernel name -> [/dev/disk/by-id/... links], best first: the storage module lists them alike.
list_by_id = by_id_links


def _skip_device(name, kind, size):
    if kind in ("ram", "rom") or name.startswith(("zram", "ram")):
        return True
    return bool((kind == "loop" or name.startswith("loop")) and not size)


def _walk(node):
    yield node
    for child in node.get("children") or []:
        yield from _walk(child)


def _mountpoints(node):
    points = node.get("mountpoints")
    if points is None:
        points = [node.get("mountpoint")]
    return [p for p in points if p]


def parse_lsblk(json_text, root_disks=(), by_id=None, mounts_by_majmin=None):
    """``lsblk -J -b -O`` (or any column list with NAME, TYPE, SIZE) -> block_devices.

    ``root_disks``: kernel names known to hold / , /boot or /boot/efi (from mountinfo), added to
    what lsblk's own mountpoints say; ``by_id``: kernel name -> by-id links; ``mounts_by_majmin``:
    "maj:min" -> mountpoints, merged with lsblk's (lsblk may miss mounts in other namespaces).
    """
    data = json.loads(json_text) if isinstance(json_text, str) else json_text
    return _devices(_lsblk_found(data, mounts_by_majmin or {}), root_disks, by_id)


def _lsblk_found(data, mounts_by_majmin):
    for disk in data.get("blockdevices") or []:
        name = disk.get("kname") or disk.get("name")
        kind = (disk.get("type") or "").lower()
        size = common.to_int(disk.get("size"), 0)
        if _skip_device(name, kind, size) or kind in ("part",):
            continue
        mountpoints, partitions, signatures, holders = [], [], [], []
        for node in _walk(disk):
            node_points = _mountpoints(node) + list(mounts_by_majmin.get(node.get("maj:min"), []))
            for point in node_points:
                if point not in mountpoints:
                    mountpoints.append(point)
        for value in (disk.get("fstype"), disk.get("pttype")):
            if value and value not in signatures:
                signatures.append(value)
        for child in disk.get("children") or []:
            child_name = child.get("kname") or child.get("name")
            child_type = (child.get("type") or "").lower()
            if child_type == "part":
                partitions.append(child_name)
                if child.get("fstype") and child["fstype"] not in signatures:
                    signatures.append(child["fstype"])
                for grandchild in child.get("children") or []:
                    holder = grandchild.get("kname") or grandchild.get("name")
                    if holder not in holders:
                        holders.append(holder)
            else:
                if child_name not in holders:
                    holders.append(child_name)
                if child_type.startswith("raid") and child_type not in signatures:
                    signatures.append(child_type)
        yield name, kind, (mountpoints, partitions, signatures, holders), dict(
            path=disk.get("path") or "/dev/" + name,
            size=size,
            model=disk.get("model"),
            serial=disk.get("serial"),
            wwn=disk.get("wwn"),
            transport=disk.get("tran"),
            rotational=_to_bool(disk.get("rota")),
            removable=_to_bool(disk.get("rm")),
            read_only=_to_bool(disk.get("ro")),
            uuid=disk.get("uuid"),
        )


def _devices(found, root_disks, by_id):
    """block_devices from what a reader found of each drive: its name, kind, (mountpoints, partitions,
    signatures, holders) and the rest of its fields."""
    root_disks = set(root_disks or ())
    by_id = by_id or {}
    return [_device(name, kind, lists, root_disks, by_id, **fields) for name, kind, lists, fields in found]


def _device(name, kind, lists, root_disks, by_id, path, size, model, serial, wwn, transport, rotational, removable,
            read_only, backing_file=None, uuid=None):
    mountpoints, partitions, signatures, holders = lists
    loop = kind == "loop" or name.startswith("loop")
    transport = _clean(transport)
    return {
        "name": name,
        "path": path,
        "size_bytes": size,
        "model": _clean(model),
        "serial": _clean(serial),
        "wwn": _clean(wwn),
        "by_id": sort_by_id(by_id.get(name, [])),
        "nvme": name.startswith("nvme") or transport == "nvme",
        "rotational": bool(rotational),
        "removable": bool(removable),
        "read_only": bool(read_only),
        "transport": transport,
        "root_disk": name in root_disks or any(p in SYSTEM_MOUNTPOINTS for p in mountpoints),
        "mounted": bool(mountpoints),
        "mountpoints": mountpoints,
        "partitions": partitions,
        "signatures": signatures,
        "holders": holders,
        "loop": loop,
        "backing_file": backing_file,
        "type": kind or ("loop" if loop else "disk"),
        "uuid": _clean(uuid),
    }


def parse_sysfs_block(root="/", root_disks=(), by_id=None, mounts_by_majmin=None, swaps=()):
    """The /sys/block fall-back when lsblk is missing: same fields, signatures only from holders."""
    return _devices(_sysfs_found(root, mounts_by_majmin or {}, swaps), root_disks, by_id)


def _sysfs_found(root, mounts_by_majmin, swaps):
    for path in sorted(glob.glob(common.path_in(root, "/sys/block/*"))):
        name = os.path.basename(path)
        base = "/sys/block/" + name
        size = common.to_int(common.read_line(root, base + "/size"), 0) * 512
        kind = "loop" if name.startswith("loop") else "disk"
        if name.startswith(("dm-", "md")):
            continue  # holders, reported under their members
        if _skip_device(name, kind, size):
            continue
        partitions = sorted(
            os.path.basename(os.path.dirname(p)) for p in glob.glob(common.path_in(root, base + "/*/partition"))
        )
        holders = []
        for node in [name, *partitions]:
            directory = base + ("/" + node if node != name else "") + "/holders"
            for holder in sorted(glob.glob(common.path_in(root, directory + "/*"))):
                holder = os.path.basename(holder)
                if holder not in holders:
                    holders.append(holder)
        signatures = []
        for holder in holders:
            level = common.read_line(root, f"/sys/block/{holder}/md/level")
            if level and level not in signatures:
                signatures.append(level)
        mountpoints = []
        for node in [name, *partitions, *holders]:
            sub = base + "/" + node if node in partitions else "/sys/block/" + node
            majmin = common.read_line(root, sub + "/dev")
            for point in mounts_by_majmin.get(majmin, []):
                if point not in mountpoints:
                    mountpoints.append(point)
            if "/dev/" + node in swaps and "[SWAP]" not in mountpoints:
                mountpoints.append("[SWAP]")
        model = common.read_line(root, base + "/device/model")
        serial = common.read_line(root, base + "/device/serial") or common.read_line(root, base + "/serial")
        wwn = common.read_line(root, base + "/wwid") or common.read_line(root, base + "/device/wwid")
        yield name, kind, (mountpoints, partitions, signatures, holders), dict(
            path="/dev/" + name,
            size=size,
            model=model,
            serial=serial,
            wwn=wwn,
            transport="nvme" if name.startswith("nvme") else None,
            rotational=common.read_line(root, base + "/queue/rotational") == "1",
            removable=common.read_line(root, base + "/removable") == "1",
            read_only=common.read_line(root, base + "/ro") == "1",
            backing_file=common.read_line(root, base + "/loop/backing_file"),
        )


def sysfs_disks_for(root, majmin=None, name=None):
    """Whole-disk kernel names under one block device (partition -> disk, dm/md -> members)."""
    index = {}
    for dev_file in glob.glob(common.path_in(root, "/sys/block/*/dev")):
        index[common.read_line("/", dev_file)] = (os.path.basename(os.path.dirname(dev_file)), None)
    for part_file in glob.glob(common.path_in(root, "/sys/block/*/*/partition")):
        part_dir = os.path.dirname(part_file)
        disk = os.path.basename(os.path.dirname(part_dir))
        index[common.read_line("/", part_dir + "/dev")] = (disk, os.path.basename(part_dir))
    target = None
    if majmin and majmin in index:
        target = index[majmin]
    elif name:
        for disk, part in index.values():
            if name in (disk, part):
                target = (disk, part)
                break
    if target is None:
        return set()
    disk, _part = target
    if disk.startswith(("dm-", "md")):
        members = set()
        for slave in glob.glob(common.path_in(root, f"/sys/block/{disk}/slaves/*")):
            members |= sysfs_disks_for(root, name=os.path.basename(slave))
        return members
    return {disk}


def root_disks_from(root, mounts):
    """Kernel names of the disks that hold /, /boot or /boot/efi according to mountinfo."""
    disks = set()
    for mount in mounts:
        if mount["mountpoint"] not in SYSTEM_MOUNTPOINTS:
            continue
        found = sysfs_disks_for(root, majmin=mount["majmin"])
        source = mount.get("source") or ""
        if not found and source.startswith("/dev/"):
            real = os.path.realpath(source) if root == "/" else source
            found = sysfs_disks_for(root, name=os.path.basename(real))
        disks |= found
    return disks


def probe_device(device_path):
    """``blkid -p`` on one device (provisioner_drives.probe) -> (signature names, "ok" | "failed",
    UUID or None).

    blkid exits 0 when it found something, 2 when nothing (or on an error, which it prints),
    8 when signatures are ambiguous (several found: the drive holds something).  The UUID is the
    filesystem's (for a btrfs member, the filesystem all its members share) or the array's.
    """
    found = probe(device_path, wipefs=False)
    if found["error"]:
        return [], "failed", None
    if found["ambiguous"]:
        return ["ambiguous"], "ok", None
    names = []
    for key, value in found["tags"].items():
        if key in ("TYPE", "PTTYPE") and value not in names:
            names.append(value)
    return names, "ok", found["tags"].get("UUID")


def probe_signatures(device_path):
    """``blkid -p`` on one device -> (signature names, "ok" | "failed"); see probe_device."""
    found, status, _uuid = probe_device(device_path)
    return found, status


UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def mounted_btrfs_members(root="/"):
    """kernel name -> filesystem UUID for every device of a mounted btrfs (/sys/fs/btrfs/<fsid>/devices/).

    The kernel lists every member there, while the mount table names one of them as the source;
    readable without root and without a udev database (containers)."""
    members: dict[str, str] = {}
    for directory in sorted(glob.glob(common.path_in(root, "/sys/fs/btrfs/*/devices"))):
        fsid = os.path.basename(os.path.dirname(directory))
        if not UUID_RE.match(fsid):
            continue
        for entry in sorted(os.listdir(directory)):
            members.setdefault(entry, fsid)
    return members


def _add_mounts_by_source(devices, mounts, root):
    """A mount whose source names a device but whose maj:min does not (btrfs mounts carry an anonymous
    0:N) still makes that device mounted: the /sys/block fall-back matches by maj:min only."""
    for mount in mounts:
        source = mount.get("source") or ""
        if not source.startswith("/dev/"):
            continue
        name = os.path.basename(os.path.realpath(source) if root == "/" else source)
        for device in devices:
            if name in [device["name"], *device["partitions"]] and mount["mountpoint"] not in device["mountpoints"]:
                device["mountpoints"].append(mount["mountpoint"])
                device["mounted"] = True


def gather_block_devices(root="/", warnings=None, sources=None, probe=True):
    warnings = warnings if warnings is not None else []
    sources = sources if sources is not None else {}
    mountinfo = common.read_text(root, "/proc/self/mountinfo", "") or common.read_text(root, "/proc/1/mountinfo", "")
    mounts = common.parse_mountinfo(mountinfo)
    swaps = parse_swaps(common.read_text(root, "/proc/swaps", ""))
    mounts_by_majmin: dict[str, list[str]] = {}
    for mount in mounts:
        mounts_by_majmin.setdefault(mount["majmin"], []).append(mount["mountpoint"])
    root_disks = root_disks_from(root, mounts)
    by_id = list_by_id(root)

    devices = None
    if root == "/":
        proc = common.run(["lsblk", "-J", "-b", "-O"])
        if proc is None or proc.returncode != 0:
            proc = common.run(["lsblk", "-J", "-b", "-o", "NAME,KNAME,PATH,MAJ:MIN,TYPE,SIZE,FSTYPE,PTTYPE,MOUNTPOINT,"
                                                           "ROTA,RM,RO,MODEL,SERIAL,WWN,TRAN,UUID"])
        if proc is not None and proc.returncode == 0:
            try:
                devices = parse_lsblk(proc.stdout, root_disks=root_disks, by_id=by_id,
                                      mounts_by_majmin=mounts_by_majmin)
                sources["block_devices"] = "lsblk"
            except ValueError as exc:
                warnings.append(f"lsblk output unreadable ({exc}); used /sys/block")
        else:
            warnings.append("lsblk unavailable or failed; used /sys/block")
    if devices is None:
        devices = parse_sysfs_block(root, root_disks=root_disks, by_id=by_id,
                                    mounts_by_majmin=mounts_by_majmin, swaps=swaps)
        sources["block_devices"] = "sysfs"
    _add_mounts_by_source(devices, mounts, root)
    btrfs_members = mounted_btrfs_members(root)

    for device in devices:
        if device["loop"] and not device.get("backing_file"):
            device["backing_file"] = common.read_line(root, "/sys/block/{}/loop/backing_file".format(device["name"]))
        if "[SWAP]" not in device["mountpoints"]:
            names = [device["name"]] + device["partitions"]
            if any("/dev/" + n in swaps for n in names):
                device["mountpoints"].append("[SWAP]")
                device["mounted"] = True
        device["signature_probe"] = "skipped"
        # A drive mounted as a whole (a filesystem on the drive itself, as storage makes them) is probed
        # too: its filesystem's UUID is how the plan knows the data array it built (lsblk shows none
        # without a udev database, as in containers, nor does /sys/fs/btrfs there).
        whole_mount = device["mounted"] and not device["partitions"] and "[SWAP]" not in device["mountpoints"]
        if probe and root == "/" and (not device["mounted"] or whole_mount) and hasattr(os, "geteuid") and os.geteuid() == 0:
            found, device["signature_probe"], uuid = probe_device(device["path"])
            device["uuid"] = device["uuid"] or uuid
            for signature in found:
                if signature not in device["signatures"]:
                    device["signatures"].append(signature)
        fsid = btrfs_members.get(device["name"])
        if fsid:
            device["uuid"] = device["uuid"] or fsid
            if "btrfs" not in device["signatures"]:
                device["signatures"].append("btrfs")
    return devices
