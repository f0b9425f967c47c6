#!/usr/bin/python
# Copyright: provisioner contributors
# Apache License 2.0 (see pyproject.toml)
"""Inspect the drives named for the data array on the target and decide what to do with them.

Read-only: resolves each configured id to a block device, inspects it (partitions, signatures,
mounts, holders, btrfs/md/XFS superblocks read straight from the device) and decides, for the
requested layout, whether the existing array/filesystem is adopted, what is created (with the
exact command lines), or why the role refuses. It changes nothing, the same in check mode.

Parsing and the decision are pure functions at module level so that the tests can import this
file and feed it hand-made device descriptions.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: provisioner_storage
short_description: Inspect data drives and plan the data array (read-only)
description:
  - Resolves O(devices) (C(/dev/disk/by-id/...) paths, C(serial:XYZ), C(wwn:0x...), or kernel names such as
    C(/dev/loop3) only with O(allow_unstable_names)) to block devices on the target.
  - Inspects each one (partitions, C(wipefs -n -J) and C(blkid -p) signatures, mounts from
    C(/proc/self/mountinfo), swap, holders) and reads btrfs, md (1.2) and XFS superblocks straight from the
    device, so that an array that already matches the request is adopted even before btrfs-progs or mdadm is
    installed.
  - Returns C(storage) with C(action) (C(adopt), C(create), C(assemble), C(mkfs) or C(refuse)), one-line
    C(refusals), the C(commands) (argv lists) a real run executes, the planned filesystem/array UUIDs
    (derived from the drives' identities, so check mode shows the same UUIDs a real run creates), the
    C(mount) entry and the member details for the udev rule.
version_added: "0.1.0"
author:
  - provisioner contributors
options:
  devices:
    description: The drives for the data array, by stable id.
    type: list
    elements: str
    required: true
  wipe_devices:
    description: Drives (same id forms) whose signatures or partitions may be wiped.
    type: list
    elements: str
    default: []
  allow_unstable_names:
    description: Accept kernel names like C(/dev/loop3) (tests and VMs only; they can change across reboots).
    type: bool
    default: false
  level:
    description: RAID level.
    type: str
    choices: [raid0, raid1, raid10, single]
    required: true
  backend:
    description: mdadm (with XFS) or btrfs.
    type: str
    choices: [mdadm, btrfs]
    required: true
  md_name:
    description: Name of the md array (C(/dev/md/NAME)) and label of the filesystem.
    type: str
    default: data
  chunk_kb:
    description: md chunk size in KiB (RAID0/RAID10).
    type: int
    default: 512
  mountpoint:
    description: Where the filesystem is mounted.
    type: path
    default: /data
  hostname:
    description: Home host recorded in a new md array (default the target's short host name).
    type: str
  root:
    description: Read C(sys/), C(proc/) and C(dev/) below this directory (tests); commands only run for C(/).
    type: path
    default: /
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
notes:
  - Linux only. Needs root to read the devices.
"""

EXAMPLES = r"""
- name: Inspect the data drives
  provisioner_storage:
    devices: [/dev/disk/by-id/nvme-A, /dev/disk/by-id/nvme-B]
    level: raid0
    backend: mdadm
  register: probe
"""

RETURN = r"""
storage:
  description: Members, what was found on them, the decision and the planned commands.
  returned: always
  type: dict
"""

import contextlib
import errno
import glob
import json
import mmap
import os
import re
import socket
import struct
import uuid

try:
    from ansible.module_utils.basic import AnsibleModule
except ImportError:  # imported by the tests without ansible on the path
    AnsibleModule = None

try:  # installed as the provisioner.ml collection
    from ansible_collections.provisioner.ml.plugins.module_utils.provisioner_common import (
        parse_mountinfo,
        path_in,
        read_line,
        to_int,
        unescape_octal,
    )
    from ansible_collections.provisioner.ml.plugins.module_utils.provisioner_constants import (
        MD_CHUNK_KB,
        MIN_DRIVES,
        STORAGE_BACKENDS,
        STORAGE_LEVELS,
        SYSTEM_MOUNTPOINTS,
    )
    from ansible_collections.provisioner.ml.plugins.module_utils.provisioner_drive_rules import (
        describe_contents,
        findings,
        has_contents,
    )
    from ansible_collections.provisioner.ml.plugins.module_utils.provisioner_drives import (
        by_id_links,
        is_absent,
        list_disks,
        parse_swaps,
        probe,
        resolve,
    )
except ImportError:  # run from the repository: ansible.cfg and the CLI put plugins/module_utils on the path
    from ansible.module_utils.provisioner_common import parse_mountinfo, path_in, read_line, to_int, unescape_octal
    from ansible.module_utils.provisioner_constants import (
        MD_CHUNK_KB,
        MIN_DRIVES,
        STORAGE_BACKENDS,
        STORAGE_LEVELS,
        SYSTEM_MOUNTPOINTS,
    )
    from ansible.module_utils.provisioner_drive_rules import describe_contents, findings, has_contents
    from ansible.module_utils.provisioner_drives import by_id_links, is_absent, list_disks, parse_swaps, probe, resolve

MD_LEVEL_NUMBER = {"raid0": 0, "raid1": 1, "raid10": 10}
MD_LEVEL_NAME = {0: "raid0", 1: "raid1", 10: "raid10", 4: "raid4", 5: "raid5", 6: "raid6", -1: "linear"}
UUID_NAMESPACE = uuid.UUID("6f1d3b52-57c1-4c8e-9a53-7a4f0c2d8e11")
WIPE_HINT = "add it to storage_wipe_devices to allow wiping it"

# btrfs on-disk constants
BTRFS_SUPER_OFFSET = 0x10000
BTRFS_MAGIC = b"_BHRfS_M"
BTRFS_CHUNK_ITEM_KEY = 228
BTRFS_HEADER_SIZE = 101
BTRFS_BG_FLAGS = (
    ("data", 1 << 0),
    ("system", 1 << 1),
    ("metadata", 1 << 2),
)
BTRFS_PROFILE_FLAGS = (
    ("raid0", 1 << 3),
    ("raid1", 1 << 4),
    ("dup", 1 << 5),
    ("raid10", 1 << 6),
    ("raid5", 1 << 7),
    ("raid6", 1 << 8),
    ("raid1c3", 1 << 9),
    ("raid1c4", 1 << 10),
)
MD_MAGIC = 0xA92B4EFC
MD_SUPER_1_2_OFFSET = 4096


# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------


def read_at(path, offset, length):
    """``length`` bytes at ``offset`` of a block device, bypassing the page cache where possible
    (a mounted filesystem writes its metadata around the block device's cache)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno != errno.EINVAL or not flags & getattr(os, "O_DIRECT", 0):
            raise
        fd, flags = os.open(path, os.O_RDONLY), os.O_RDONLY
    try:
        if flags & getattr(os, "O_DIRECT", 0) and offset % 4096 == 0 and length % 4096 == 0:
            buf = mmap.mmap(-1, length)  # page aligned, as O_DIRECT wants
            try:
                count = os.preadv(fd, [buf], offset)
                return bytes(buf[:count])
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
            finally:
                buf.close()
            os.close(fd)
            fd = os.open(path, os.O_RDONLY)
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def format_uuid(raw):
    return str(uuid.UUID(bytes=bytes(raw)))


def md_uuid_text(raw):
    """mdadm's notation of an array UUID: four groups of 8 hex digits joined by colons."""
    hexed = bytes(raw).hex()
    return ":".join(hexed[i:i + 8] for i in range(0, 32, 8))


# --------------------------------------------------------------------------
# superblocks
# --------------------------------------------------------------------------


def parse_btrfs_super(buf):
    """The btrfs superblock (4 KiB read at 64 KiB) -> dict, or None without the magic."""
    if len(buf) < 0x32B + 2048 or buf[0x40:0x48] != BTRFS_MAGIC:
        return None
    devid = struct.unpack_from("<Q", buf, 0xC9)[0]
    sys_size = struct.unpack_from("<I", buf, 0xA0)[0]
    label = buf[0x12B:0x12B + 256].split(b"\0", 1)[0].decode("utf-8", "replace")
    return {
        "fsid": format_uuid(buf[0x20:0x30]),
        "generation": struct.unpack_from("<Q", buf, 0x48)[0],
        "chunk_root": struct.unpack_from("<Q", buf, 0x58)[0],
        "total_bytes": struct.unpack_from("<Q", buf, 0x70)[0],
        "num_devices": struct.unpack_from("<Q", buf, 0x88)[0],
        "sectorsize": struct.unpack_from("<I", buf, 0x90)[0],
        "nodesize": struct.unpack_from("<I", buf, 0x94)[0],
        "chunk_root_level": buf[0xC7],
        "devid": devid,
        "dev_uuid": format_uuid(buf[0xC9 + 66:0xC9 + 82]),
        "label": label,
        "sys_chunks": parse_chunk_array(buf[0x32B:0x32B + min(sys_size, 2048)]),
    }


def _chunk_item(buf, offset):
    """A btrfs chunk item at ``offset`` -> (dict, size in bytes)."""
    length, _owner, stripe_len, flags = struct.unpack_from("<QQQQ", buf, offset)
    num_stripes, sub_stripes = struct.unpack_from("<HH", buf, offset + 44)
    stripes = []
    for index in range(num_stripes):
        devid, physical = struct.unpack_from("<QQ", buf, offset + 48 + 32 * index)
        stripes.append({"devid": devid, "offset": physical})
    chunk = {
        "length": length,
        "stripe_len": stripe_len,
        "flags": flags,
        "sub_stripes": sub_stripes or 1,
        "stripes": stripes,
    }
    return chunk, 48 + 32 * num_stripes


def parse_chunk_array(buf):
    """The superblock's sys_chunk_array: (key, chunk item) pairs for the SYSTEM chunks."""
    chunks, offset = [], 0
    while offset + 17 + 48 <= len(buf):
        _objectid, key_type, logical = struct.unpack_from("<QBQ", buf, offset)
        if key_type != BTRFS_CHUNK_ITEM_KEY:
            break
        chunk, size = _chunk_item(buf, offset + 17)
        chunk["logical"] = logical
        chunks.append(chunk)
        offset += 17 + size
    return chunks


def chunk_profile(flags):
    """Block group flags -> (kinds, profile), e.g. (["data"], "raid0")."""
    kinds = [name for name, bit in BTRFS_BG_FLAGS if flags & bit]
    profile = "single"
    for name, bit in BTRFS_PROFILE_FLAGS:
        if flags & bit:
            profile = name
    return kinds, profile


def map_logical(chunks, logical):
    """Logical address -> [(devid, physical)] candidates (every copy for mirrored profiles)."""
    for chunk in chunks:
        start = chunk["logical"]
        if not start <= logical < start + chunk["length"]:
            continue
        offset = logical - start
        stripes, stripe_len = chunk["stripes"], chunk["stripe_len"] or 65536
        _kinds, profile = chunk_profile(chunk["flags"])
        if profile in ("raid0", "raid10"):
            sub = chunk["sub_stripes"] if profile == "raid10" else 1
            factor = max(1, len(stripes) // sub)
            stripe_nr, within = divmod(offset, stripe_len)
            row, column = divmod(stripe_nr, factor)
            physical = row * stripe_len + within
            return [(s["devid"], s["offset"] + physical) for s in stripes[column * sub:(column + 1) * sub]]
        if profile in ("raid5", "raid6"):
            return []
        return [(s["devid"], s["offset"] + offset) for s in stripes]
    return []


def btrfs_profiles(devices_by_devid, sb, reader=read_at):
    """Walk the chunk tree (read-only, from the devices) -> {"data": [...], "metadata": [...],
    "system": [...]} profiles in use, or None when the tree cannot be read."""
    sys_chunks = sb["sys_chunks"]
    nodesize = sb["nodesize"] or 16384
    found: dict[str, set] = {"data": set(), "metadata": set(), "system": set()}
    for chunk in sys_chunks:
        kinds, profile = chunk_profile(chunk["flags"])
        for kind in kinds:
            found[kind].add(profile)

    def read_node(logical):
        for devid, physical in map_logical(sys_chunks, logical):
            path = devices_by_devid.get(devid)
            if path is None:
                continue
            try:
                node = reader(path, physical, nodesize)
            except OSError:
                continue
            if len(node) == nodesize and struct.unpack_from("<Q", node, 48)[0] == logical:
                return node
        return None

    pending, visited = [sb["chunk_root"]], 0
    while pending:
        logical = pending.pop()
        visited += 1
        if visited > 4096:
            return None
        node = read_node(logical)
        if node is None:
            return None
        nritems = struct.unpack_from("<I", node, 96)[0]
        level = node[100]
        if level > 0:
            for index in range(nritems):
                base = BTRFS_HEADER_SIZE + 33 * index
                pending.append(struct.unpack_from("<Q", node, base + 17)[0])
            continue
        for index in range(nritems):
            base = BTRFS_HEADER_SIZE + 25 * index
            _objectid, key_type, _offset = struct.unpack_from("<QBQ", node, base)
            data_offset, _size = struct.unpack_from("<II", node, base + 17)
            if key_type != BTRFS_CHUNK_ITEM_KEY:
                continue
            chunk, _ = _chunk_item(node, BTRFS_HEADER_SIZE + data_offset)
            kinds, profile = chunk_profile(chunk["flags"])
            for kind in kinds:
                found[kind].add(profile)
    return {kind: sorted(values) for kind, values in found.items()}


def parse_md_super(buf):
    """An md v1.x superblock -> dict, or None without the magic."""
    if len(buf) < 512 or struct.unpack_from("<I", buf, 0)[0] != MD_MAGIC:
        return None
    major = struct.unpack_from("<I", buf, 4)[0]
    if major != 1:
        return None
    level = struct.unpack_from("<i", buf, 72)[0]
    dev_number = struct.unpack_from("<I", buf, 160)[0]
    max_dev = struct.unpack_from("<I", buf, 220)[0]
    role = None
    if dev_number < max_dev and 256 + 2 * dev_number + 2 <= len(buf):
        role = struct.unpack_from("<H", buf, 256 + 2 * dev_number)[0]
    name = buf[32:64].split(b"\0", 1)[0].decode("utf-8", "replace")
    return {
        "uuid": md_uuid_text(buf[16:32]),
        "name": name,
        "short_name": name.split(":", 1)[-1],
        "level": MD_LEVEL_NAME.get(level, str(level)),
        "chunk_kb": struct.unpack_from("<I", buf, 88)[0] // 2,
        "raid_disks": struct.unpack_from("<I", buf, 92)[0],
        "data_offset": struct.unpack_from("<Q", buf, 128)[0] * 512,
        "role": role if role is not None and role < 0xFFFE else None,
    }


def parse_xfs_super(buf):
    """The XFS superblock (first sector) -> {"uuid", "label"}, or None."""
    if len(buf) < 120 or buf[0:4] != b"XFSB":
        return None
    label = buf[108:120].split(b"\0", 1)[0].decode("utf-8", "replace")
    return {"uuid": format_uuid(buf[32:48]), "label": label}


# --------------------------------------------------------------------------
# the target: ids, block devices, mounts
# --------------------------------------------------------------------------


def signatures_of(path):
    """Every signature on a device: wipefs -n -J (all of them), blkid -p as the fall-back
    (provisioner_drives.probe). Returns (list of {"type", "label", "uuid", "offset"}, None) or (None, reason)."""
    found = probe(path, tags=False)
    if found["error"]:
        return None, found["error"]
    return found["entries"], None


def inspect_device(kname, root="/", mounts=(), swaps=(), probe=True):
    """What is on one whole block device."""
    base = "/sys/block/" + kname
    path = "/dev/" + kname
    partitions = sorted(
        os.path.basename(os.path.dirname(p)) for p in glob.glob(path_in(root, base + "/*/partition"))
    )
    holders = sorted(os.path.basename(p) for p in glob.glob(path_in(root, base + "/holders/*")))
    for part in partitions:
        holders += [os.path.basename(p) for p in glob.glob(path_in(root, f"{base}/{part}/holders/*"))]
    majmins = {read_line(root, base + "/dev")}
    majmins |= {read_line(root, f"{base}/{part}/dev") for part in partitions}
    mountpoints = [m["mountpoint"] for m in mounts if m["majmin"] in majmins]
    names = ["/dev/" + n for n in [kname, *partitions]]
    if any(s in names for s in swaps):
        mountpoints.append("[SWAP]")
    sched_text = read_line(root, base + "/queue/scheduler") or ""
    match = re.search(r"\[([^\]]+)\]", sched_text)
    device = {
        "kname": kname,
        "path": path,
        "size_bytes": (to_int(read_line(root, base + "/size"), 0) or 0) * 512,
        "read_only": read_line(root, base + "/ro") == "1",
        "serial": read_line(root, base + "/device/serial") or read_line(root, base + "/serial"),
        "wwid": read_line(root, base + "/wwid") or read_line(root, base + "/device/wwid"),
        "model": read_line(root, base + "/device/model"),
        "nvme": kname.startswith("nvme"),
        "loop": kname.startswith("loop"),
        "backing_file": read_line(root, base + "/loop/backing_file"),
        "rotational": read_line(root, base + "/queue/rotational") == "1",
        "scheduler": match.group(1) if match else (sched_text or None),
        "read_ahead_kb": to_int(read_line(root, base + "/queue/read_ahead_kb")),
        "partitions": partitions,
        "holders": sorted(set(holders)),
        "mountpoints": mountpoints,
        "signatures": [],
        "probe_error": None,
        "btrfs": None,
        "md": None,
        "xfs": None,
    }
    if not probe:
        return device
    sigs, error = signatures_of(path)
    device["signatures"] = sigs or []
    device["probe_error"] = error
    for name, offset, parser in (
        ("btrfs", BTRFS_SUPER_OFFSET, parse_btrfs_super),
        ("md", MD_SUPER_1_2_OFFSET, parse_md_super),
        ("xfs", 0, parse_xfs_super),
    ):
        try:
            device[name] = parser(read_at(path, offset, 4096))
        except (OSError, struct.error, ValueError) as exc:
            if device["probe_error"] is None and not isinstance(exc, struct.error):
                device["probe_error"] = f"cannot read {path}: {exc}"
    return device


def md_arrays(root="/"):
    """Running md arrays from sysfs -> {mdX: {level, raid_disks, chunk_kb, slaves, state}}."""
    arrays = {}
    for entry in sorted(glob.glob(path_in(root, "/sys/block/md*/md"))):
        name = os.path.basename(os.path.dirname(entry))
        base = f"/sys/block/{name}/md"
        arrays[name] = {
            "device": "/dev/" + name,
            "level": read_line(root, base + "/level"),
            "raid_disks": to_int(read_line(root, base + "/raid_disks")),
            "chunk_kb": (to_int(read_line(root, base + "/chunk_size"), 0) or 0) // 1024,
            "state": read_line(root, base + "/array_state"),
            "slaves": sorted(os.path.basename(p) for p in glob.glob(path_in(root, f"/sys/block/{name}/slaves/*"))),
            "majmin": read_line(root, f"/sys/block/{name}/dev"),
            "degraded": to_int(read_line(root, base + "/degraded"), 0) or 0,
            "sync_action": read_line(root, base + "/sync_action"),
        }
    return arrays


def named_array(root, name, arrays):
    """The running array that /dev/md/NAME points to (its kernel name, e.g. md127), or None."""
    link = path_in(root, f"/dev/md/{name}")
    if not os.path.lexists(link):
        return None
    try:
        target = os.path.realpath(link) if root == "/" else os.path.join(os.path.dirname(link), os.readlink(link))
    except OSError:
        return None
    kname = os.path.basename(os.path.normpath(target))
    return kname if kname in arrays else None


def md_driver(root="/"):
    """("loaded" | "module" | "absent", reason)."""
    if os.path.exists(path_in(root, "/proc/mdstat")):
        return "loaded", "md driver loaded (/proc/mdstat present)"
    release = os.uname()[2] if root == "/" else (read_line(root, "/proc/sys/kernel/osrelease") or "")
    moddir = f"/lib/modules/{release}"
    for listing in ("modules.builtin", "modules.dep"):
        text = ""
        try:
            with open(path_in(root, moddir + "/" + listing)) as handle:
                text = handle.read()
        except OSError:
            continue
        if re.search(r"(^|/)md-mod\.ko", text, re.MULTILINE):
            return "module", "md driver available as module md_mod (loaded before creating the array)"
    return "absent", "no md driver in this kernel (/proc/mdstat absent)"


# --------------------------------------------------------------------------
# the decision (pure)
# --------------------------------------------------------------------------


def planned_uuid(kind, members, spec):
    """A UUID for a new array or filesystem, derived from the drives' identities and the layout:
    check mode and the real run show the same, a second drive set gets another."""
    identity = [
        {
            "serial": m.get("serial"),
            "wwid": m.get("wwid"),
            "backing_file": m.get("backing_file"),
            "id": m.get("id") if not (m.get("serial") or m.get("wwid")) else None,
            "size": m.get("size_bytes"),
        }
        for m in sorted(members, key=lambda m: m["id"])
    ]
    seed = json.dumps(
        {"kind": kind, "members": identity, "level": spec["level"], "backend": spec["backend"], "name": spec["md_name"]},
        sort_keys=True,
    )
    return str(uuid.uuid5(UUID_NAMESPACE, seed))


def _who(member):
    return member["id"] if member["id"] == member["path"] else "{} ({})".format(member["id"], member["path"])


def _profile_for(level, count):
    data = level
    metadata = "raid1" if count > 1 else "dup"
    return data, metadata


def match_btrfs(members, spec):
    """(True, fs) when the members carry exactly one btrfs filesystem spanning exactly them with the
    requested profiles; (False, why) when they carry one that differs; (None, None) when none."""
    sbs = [m.get("btrfs") for m in members]
    if not any(sbs):
        return None, None
    fsids = sorted({sb["fsid"] for sb in sbs if sb})
    if len(fsids) != 1 or not all(sbs):
        return False, "that btrfs filesystem covers only some of the listed drives" if len(fsids) == 1 else "the btrfs filesystems {} cover only some of the listed drives".format(", ".join(fsids))
    sb = sbs[0]
    devids = sorted(s["devid"] for s in sbs)
    if sb["num_devices"] != len(members) or len(set(devids)) != len(devids):
        return False, "that btrfs filesystem spans {:d} device(s), {:d} of them listed".format(
            sb["num_devices"], len(members))
    profiles = members[0].get("btrfs_profiles")
    data, metadata = _profile_for(spec["level"], len(members))
    if profiles is None:
        return False, "the profiles of that btrfs filesystem could not be read"
    if profiles.get("data") != [data] or profiles.get("metadata") != [metadata]:
        return False, "that btrfs filesystem is data {}, metadata {}, not the requested data {}, metadata {}".format(
            "+".join(profiles.get("data") or ["none"]), "+".join(profiles.get("metadata") or ["none"]),
            data, metadata)
    return True, {"kind": "btrfs", "uuid": sb["fsid"], "label": sb["label"]}


def match_md(members, spec, arrays):
    """(True, info) for md members of one array with the requested level over exactly these drives;
    (False, why) for md members of another array; (None, None) when no member carries md metadata."""
    sbs = [m.get("md") for m in members]
    if not any(sbs):
        return None, None
    uuids = sorted({sb["uuid"] for sb in sbs if sb})
    if len(uuids) != 1 or not all(sbs):
        return False, "that md array covers only some of the listed drives" if len(uuids) == 1 else "the md arrays {} cover only some of the listed drives".format(", ".join(uuids))
    sb = sbs[0]
    if sb["level"] != spec["level"] or sb["raid_disks"] != len(members):
        return False, "that md array ({}) is {} over {:d} drive(s), not the requested {} over {:d}".format(
            sb["name"] or sb["uuid"], sb["level"], sb["raid_disks"], spec["level"], len(members))
    roles = sorted(s["role"] for s in sbs if s["role"] is not None)
    if roles != list(range(len(members))):
        return False, "that md array ({}) has member roles {} (spare or failed drives)".format(
            sb["name"] or sb["uuid"], roles)
    running = None
    holders = {tuple(m.get("holders") or []) for m in members}
    if len(holders) == 1:
        held = next(iter(holders))
        if len(held) == 1 and held[0] in arrays:
            array = arrays[held[0]]
            if sorted(array["slaves"]) == sorted(m["kname"] for m in members):
                running = held[0]
    if any(m.get("holders") for m in members) and running is None:
        return False, "the drives are held by {}, not by one array over exactly these drives".format(", ".join(
            sorted({h for m in members for h in (m.get("holders") or [])})))
    info = {
        "kind": "md",
        "uuid": sb["uuid"],
        "name": sb["name"],
        "chunk_kb": sb["chunk_kb"],
        "running": running,
        "data_offset": sb["data_offset"],
    }
    first = [m for m, s in zip(members, sbs) if s["role"] == 0]
    info["first_member"] = first[0]["path"] if first else None
    # gather() reads the filesystem on the array (or, not running, in the first member's data area)
    info["filesystem"] = sb.get("filesystem")
    return True, info


def degraded_context(spec, device_count, arrays, named):
    """The role's own array (/dev/md/NAME, running as NAMED) when it is the requested redundant level
    over as many drives as storage_devices names and runs on fewer: a drive was lost. Else None."""
    array = arrays.get(named) if named else None
    if not array or spec["backend"] != "mdadm" or spec["level"] not in ("raid1", "raid10"):
        return None
    if array.get("level") != spec["level"] or array.get("raid_disks") != device_count:
        return None
    if len(array.get("slaves") or []) >= device_count:
        return None  # every slot has a drive (one may be rebuilding): nothing is lost
    return array


def match_degraded(spec, members, missing, arrays, named):
    """A degraded run of the role's own array: which listed drives are its running members, which come
    back (their md superblock names the array's UUID), which are blank replacements, which hold other
    data. None when the array is not the role's degraded array over these drives (the normal decision
    applies); else {"info", "returning", "replacements", "refusals", "missing"}."""
    array = degraded_context(spec, len(members) + len(missing), arrays, named)
    if array is None:
        return None
    slaves = set(array.get("slaves") or [])
    running = [m for m in members if m["kname"] in slaves]
    if not running or slaves - {m["kname"] for m in members}:
        return None  # the array runs on drives that are not listed: not this request's array
    uuids = sorted({m["md"]["uuid"] for m in running if m.get("md")})
    if len(uuids) != 1:
        return None
    md_uuid = uuids[0]
    device = "/dev/md/{}".format(spec["md_name"])
    returning, replacements, refusals = [], [], []
    for m in members:
        if m["kname"] in slaves:
            continue
        who = _who(m)
        points = m.get("mountpoints") or []
        if points or m.get("holders"):
            refusals.append(
                "storage: refusing {} as a member of the degraded array {}: {} — {}".format(
                    who, device, ("mounted at {}".format(", ".join(points))) if points else "in use by {}".format(", ".join(m["holders"])),
                    "unmount it first" if points else "stop that first (e.g. mdadm --stop /dev/{})".format(m["holders"][0])))
        elif m.get("md") and m["md"]["uuid"] == md_uuid and not m.get("partitions"):
            returning.append(m)
        elif not has_contents(m) or m.get("wipe_allowed"):
            replacements.append(m)
        else:
            refusals.append(
                f"storage: refusing {who} as a replacement in the degraded array {device} ({md_uuid}): it holds {describe_contents(m)}, and only a "
                f"returning member of that array or a blank drive is added — {WIPE_HINT}, or list another drive")
    first = running[0]["md"]
    info = {
        "kind": "md",
        "uuid": md_uuid,
        "name": first.get("name"),
        "chunk_kb": first.get("chunk_kb"),
        "running": named,
        "data_offset": first.get("data_offset"),
        "first_member": None,
        "filesystem": array.get("filesystem"),
    }
    return {
        "info": info,
        "device": device,
        "kname": named,
        "raid_disks": array.get("raid_disks"),
        "active": len(slaves),
        "returning": returning,
        "replacements": replacements,
        "refusals": refusals,
        "missing": list(missing),
    }


def decide(spec, members, arrays=None, mountpoint_state=None, md_state=("loaded", ""), missing=(), named=None):
    """The whole decision from inspected members. Pure; returns the ``storage`` result."""
    arrays = arrays or {}
    mountpoint_state = mountpoint_state or {}
    level, backend, name = spec["level"], spec["backend"], spec["md_name"]
    refusals: list[str] = []
    warnings: list[str] = []
    uses_md = backend == "mdadm" and level != "single"
    result = {
        "level": level,
        "backend": backend,
        "filesystem": "btrfs" if backend == "btrfs" else "xfs",
        "md_name": name,
        "md_device": f"/dev/md/{name}" if uses_md else None,
        "uses_md": uses_md,
        "md_driver": md_state[0],
        "md_driver_reason": md_state[1],
        "mountpoint": spec["mountpoint"],
        "mountpoint_existed": bool(mountpoint_state.get("exists")),
        "members": members,
        "action": "refuse",
        "existing": None,
        "wipe": [],
        "commands": [],
        "refusals": refusals,
        "warnings": warnings,
    }

    need = MIN_DRIVES[level]
    named_count = len(members) + len(missing)  # a drive not on the host (lost) is still named
    if named_count < need:
        refusals.append(f"storage: {level} needs at least {need:d} device(s), storage_devices names {named_count:d}")
    if backend == "mdadm" and level == "single" and named_count != 1:
        refusals.append(f"storage: level single with the mdadm backend puts XFS on one drive; storage_devices names {named_count:d}")
    if level == "raid10" and uses_md and named_count % 2:
        refusals.append(f"storage: raid10 needs an even number of drives, storage_devices names {named_count:d}")

    # Drives in any use are refused outright; wiping does not cover them (the shared rules' findings:
    # provisioner_drive_rules.py).
    found = [dict(findings(m)) for m in members]
    for m, kinds in zip(members, found):
        who = _who(m)
        if "unprobed" in kinds:
            refusals.append("storage: refusing {}: could not be inspected ({}) — fix that first".format(who, kinds["unprobed"]))
        if "read_only" in kinds:
            refusals.append(f"storage: refusing {who}: the device is read-only")
        if "empty" in kinds:
            refusals.append(f"storage: refusing {who}: size 0 (no medium?)")

    adopt_fs = adopt_md = None
    repair = match_degraded(spec, members, missing, arrays, named) if uses_md else None
    if repair is not None:
        adopt_md = repair["info"]
        refusals.extend(repair["refusals"])
        result["wipe"] = [m for m in repair["replacements"] if has_contents(m)]
        result["degraded"] = {
            "device": repair["device"],
            "kname": repair["kname"],
            "raid_disks": repair["raid_disks"],
            "active": repair["active"],
            "missing": repair["missing"],
            "returning": [m["id"] for m in repair["returning"]],
            "replacements": [m["id"] for m in repair["replacements"]],
        }
        if repair["missing"] and not (repair["returning"] or repair["replacements"]):
            warnings.append(
                "storage: the data array {} ({}) runs degraded on {:d} of {:d} drives, {} not on this host — put the "
                "drive back, or list a blank drive in its place in storage_devices, then run up again".format(
                    repair["device"], level, repair["active"], repair["raid_disks"],
                    ", ".join(repair["missing"])))
    elif backend == "btrfs":
        ok, what = match_btrfs(members, spec)
        if ok:
            adopt_fs = what
        elif ok is False:
            result["mismatch"] = what
    elif uses_md:
        ok, what = match_md(members, spec, arrays)
        if ok:
            adopt_md = what
        elif ok is False:
            result["mismatch"] = what
    else:  # XFS directly on one drive
        if len(members) == 1:
            xfs = members[0].get("xfs")
            sigs = [s.get("type") for s in members[0].get("signatures") or []]
            if xfs and set(sigs) <= {"xfs"} and not members[0].get("partitions"):
                adopt_fs = {"kind": "xfs", "uuid": xfs["uuid"], "label": xfs["label"]}

    adopted_mounts = set()
    if adopt_fs or adopt_md:
        for m in members:
            adopted_mounts |= set(m.get("mountpoints") or [])

    for m, kinds in zip(members, found):
        who = _who(m)
        points = kinds.get("mounted") or []
        if points and not (adopt_fs or adopt_md):
            hint = " (the root disk)" if any(p in SYSTEM_MOUNTPOINTS for p in points) else ""
            refusals.append(
                "storage: refusing {}: mounted at {}{} — unmount it first; storage never unmounts or wipes a mounted "
                "drive, not even one in storage_wipe_devices".format(who, ", ".join(points), hint))
            continue
        if "held" in kinds and not adopt_md:
            refusals.append(
                "storage: refusing {}: in use by {} — stop that first (e.g. mdadm --stop /dev/{}); storage never "
                "stops arrays, not even for storage_wipe_devices".format(who, ", ".join(kinds["held"]), kinds["held"][0]))
            continue
        if adopt_fs or adopt_md:
            continue
        if "partitions" in kinds or "signatures" in kinds:
            what = describe_contents(m)
            if m.get("wipe_allowed"):
                result["wipe"].append(m)
            else:
                # A btrfs/md signature of something other than the requested layout: say how it differs.
                why = result.get("mismatch") if (m.get("btrfs") or m.get("md")) else None
                refusals.append("storage: refusing {}: holds {}{} — {}".format(
                    who, what, (f"; {why}") if why else "", WIPE_HINT))

    adopted = adopt_fs or adopt_md
    if adopted:
        points = sorted(adopted_mounts)
        if points and spec["mountpoint"] not in points:
            refusals.append(
                "storage: refusing to adopt the existing {} on {}: it is mounted at {}, not at {} — unmount it, or set "
                "storage_mountpoint: {}".format(
                    adopted["kind"], ", ".join(_who(m) for m in members), ", ".join(points),
                    spec["mountpoint"], points[0]))

    # The mount point: nothing else mounted there, nothing hidden by mounting over it.
    other = mountpoint_state.get("mounted_source")
    if mountpoint_state.get("mounted") and spec["mountpoint"] not in adopted_mounts:
        refusals.append(
            "storage: storage_mountpoint {} is already a mount of {} ({}) — choose another mount point or unmount it".format(
                spec["mountpoint"], other or "?", mountpoint_state.get("mounted_fstype") or "?"))
    elif not mountpoint_state.get("mounted") and mountpoint_state.get("entries"):
        refusals.append(
            "storage: storage_mountpoint {} is a directory with {:d} entr{} — mounting the array there would hide them; "
            "move them or choose another mount point".format(
                spec["mountpoint"], mountpoint_state["entries"], "y" if mountpoint_state["entries"] == 1 else "ies"))
    elif mountpoint_state.get("not_a_directory"):
        refusals.append("storage: storage_mountpoint {} exists and is not a directory".format(spec["mountpoint"]))

    if refusals:
        return result

    data_profile, meta_profile = _profile_for(level, len(members))
    result["btrfs_data_profile"] = data_profile if backend == "btrfs" else None
    result["btrfs_metadata_profile"] = meta_profile if backend == "btrfs" else None
    paths = [m["cmd_path"] for m in members]
    force = bool(result["wipe"])
    commands = []
    for m in result["wipe"]:
        for part in m.get("partitions") or []:
            commands.append({"argv": ["wipefs", "--all", "/dev/" + part],
                             "why": "wipe {} on {} (storage_wipe_devices)".format(part, m["id"])})
        commands.append({"argv": ["wipefs", "--all", m["cmd_path"]],
                         "why": "wipe {}: {} (storage_wipe_devices)".format(m["id"], describe_contents(m))})
        if m.get("partitions"):
            commands.append({"argv": ["blockdev", "--rereadpt", m["cmd_path"]],
                             "why": "drop the wiped partitions of {} from the kernel".format(m["id"])})

    md_uuid = fs_uuid = None
    md_device = result["md_device"]
    fs_device = None
    if backend == "btrfs":
        if adopt_fs:
            result["action"] = "adopt"
            result["existing"] = adopt_fs
            fs_uuid = adopt_fs["uuid"]
        else:
            result["action"] = "create"
            fs_uuid = planned_uuid("btrfs", members, spec)
            argv = ["mkfs.btrfs"] + (["--force"] if force else []) + [
                "--label", name, "--uuid", fs_uuid, "--data", data_profile, "--metadata", meta_profile] + paths
            commands.append({"argv": argv, "why": f"create btrfs data {data_profile}, metadata {meta_profile} over {len(members):d} drive(s)"})
        fs_device = paths[0]
    elif uses_md:
        sw = {"raid0": len(members), "raid10": len(members) // 2, "raid1": 1}[level]
        chunk = spec["chunk_kb"]
        if adopt_md:
            md_uuid = adopt_md["uuid"]
            result["existing"] = adopt_md
            if adopt_md["chunk_kb"] and level != "raid1" and adopt_md["chunk_kb"] != chunk:
                warnings.append("storage: the existing array has a {:d} KiB chunk, storage_chunk_kb is {:d}; adopted as it is"
                                .format(adopt_md["chunk_kb"], chunk))
                chunk = adopt_md["chunk_kb"]
            if adopt_md["running"]:
                md_device_now = "/dev/" + adopt_md["running"]
            else:
                md_device_now = md_device
                commands.append({"argv": ["mdadm", "--assemble", md_device, f"--uuid={md_uuid}", *paths],
                                 "why": f"assemble the existing {level} array {md_uuid}"})
                commands += _udev_settle(spec, md_device)
            fs = adopt_md.get("filesystem")
            ours = md_uuid == md_uuid_text(uuid.UUID(planned_uuid("md", members, spec)).bytes)
            if fs and fs.get("kind") == "xfs" and ours and fs.get("uuid") != planned_uuid("xfs", members, spec):
                # Storage made this array but not this filesystem: a create stopped between mdadm and
                # mkfs leaves the drives' earlier XFS superblock showing through the new array.
                leftover = "storage: the array {} that storage created holds an XFS (UUID {}) that storage did not make".format(
                    md_uuid, fs.get("uuid"))
                if not any(m.get("wipe_allowed") for m in members):
                    return _refuse(result, leftover + " (left from the drives' earlier contents, or made by hand) — "
                                   "add its drives to storage_wipe_devices to make the filesystem again, or mount it by hand")
                warnings.append(leftover + "; made again, as storage_wipe_devices allows")
                fs, force = None, True
            if fs and fs.get("kind") == "xfs":
                result["action"] = "adopt" if adopt_md["running"] else "assemble"
                fs_uuid = fs["uuid"]
            elif fs:
                return _refuse(result, "storage: refusing to adopt array {}: it holds a {} filesystem, not XFS — wipe it "
                                       "by hand if it may go".format(md_uuid, fs.get("kind")))
            else:
                result["action"] = "mkfs" if adopt_md["running"] else "assemble"
                fs_uuid = planned_uuid("xfs", members, spec)
                commands.append({"argv": _mkfs_xfs(name, fs_uuid, chunk, sw, level, force, md_device),
                                 "why": "create XFS on the existing array (it holds no filesystem)"})
            md_device = md_device_now if adopt_md["running"] else md_device
            if repair is not None and result["action"] == "adopt":
                for m in repair["returning"]:
                    # --re-add resumes a recent member where it left off; otherwise --add rebuilds it.
                    commands.append({"argv": ["mdadm", md_device, "--re-add", m["cmd_path"]],
                                     "fallback": ["mdadm", md_device, "--add", m["cmd_path"]],
                                     "why": "re-add {}, a member of the degraded array {}".format(m["id"], md_uuid)})
                for m in repair["replacements"]:
                    commands.append({"argv": ["mdadm", md_device, "--add", m["cmd_path"]],
                                     "why": "add {} in place of a lost member of the array {}".format(m["id"], md_uuid)})
                if commands:
                    result["action"] = "repair"
        else:
            result["action"] = "create"
            md_uuid = md_uuid_text(uuid.UUID(planned_uuid("md", members, spec)).bytes)
            fs_uuid = planned_uuid("xfs", members, spec)
            argv = ["mdadm", "--create", md_device, "--run", "--metadata=1.2", f"--level={level}",
                    f"--raid-devices={len(members):d}"]
            if level != "raid1":
                argv.append(f"--chunk={chunk:d}")
            argv += [f"--name={name}", "--homehost={}".format(spec.get("hostname", "any")), f"--uuid={md_uuid}", *paths]
            commands.append({"argv": argv, "why": f"create md {level} over {len(members):d} drive(s)"})
            commands += _udev_settle(spec, md_device)
            commands.append({"argv": _mkfs_xfs(name, fs_uuid, chunk, sw, level, force, md_device),
                             "why": f"create XFS aligned to the {chunk:d} KiB chunk x {sw:d} data drive(s)"})
        fs_device = md_device
        result["chunk_kb"] = chunk
        result["stripe_width"] = sw
    else:
        if adopt_fs:
            result["action"] = "adopt"
            result["existing"] = adopt_fs
            fs_uuid = adopt_fs["uuid"]
        else:
            result["action"] = "create"
            fs_uuid = planned_uuid("xfs", members, spec)
            commands.append({"argv": _mkfs_xfs(name, fs_uuid, None, None, level, force, paths[0]),
                             "why": "create XFS directly on {}".format(members[0]["id"])})
        fs_device = paths[0]

    result["wipe"] = [m["id"] for m in result["wipe"]]
    for m in members:
        m["contents"] = describe_contents(m)
    result["commands"] = commands
    result["md_uuid"] = md_uuid
    result["md_device"] = md_device
    result["fs_uuid"] = fs_uuid
    result["fs_device"] = fs_device
    options = ["noatime", "nofail"]
    if backend == "btrfs" and len(members) > 1:
        # Tells the kernel every member at mount time: no btrfs device scan needed (udev, or a
        # container without /dev/btrfs-control).
        options += [f"device={p}" for p in paths]
    result["mount"] = {
        "src": f"UUID={fs_uuid}",
        "path": spec["mountpoint"],
        "fstype": result["filesystem"],
        "opts": ",".join(options),
    }
    result["fstab_line"] = "UUID={} {} {} {} 0 0".format(fs_uuid, spec["mountpoint"], result["filesystem"], result["mount"]["opts"])
    result["mdadm_array_line"] = (
        "ARRAY {} metadata=1.2 UUID={}".format(f"/dev/md/{name}", md_uuid) if uses_md else None
    )
    result["needs_md_driver"] = uses_md and any(c["argv"][0] == "mdadm" for c in commands)
    result["refusals"] = []
    return result


def _refuse(result, message):
    result["action"] = "refuse"
    result["refusals"].append(message)
    return result


def _udev_settle(spec, md_device):
    """Where udev runs, it names a started array (/dev/md/NAME): under load that can take longer
    than mdadm waits, and the next command (mkfs, blkid) would not find the name."""
    if not spec.get("udev"):
        return []
    return [{"argv": ["udevadm", "settle", "--timeout=120"], "why": f"wait until udev has named the array {md_device}"}]


def _mkfs_xfs(label, fs_uuid, chunk, sw, level, force, device):
    argv = ["mkfs.xfs"] + (["-f"] if force else []) + ["-L", label, "-m", f"uuid={fs_uuid}"]
    if chunk and level in ("raid0", "raid10"):
        argv += ["-d", f"su={chunk:d}k,sw={sw:d}"]
    return [*argv, device]


# --------------------------------------------------------------------------
# gathering on the target
# --------------------------------------------------------------------------


def _mountpoint_state(path, mounts, root="/"):
    state = {"mounted": False, "entries": 0, "not_a_directory": False,
             "exists": os.path.isdir(path_in(root, path))}
    for mount in mounts:
        if mount["mountpoint"] == path:
            state.update(mounted=True, mounted_source=mount["source"], mounted_fstype=mount["fstype"])
    full = path_in(root, path)
    if os.path.lexists(full) and not os.path.isdir(full):
        state["not_a_directory"] = True
    elif os.path.isdir(full) and not state["mounted"]:
        with contextlib.suppress(OSError):
            state["entries"] = len([n for n in os.listdir(full) if n != "lost+found"])
    return state


def parse_fstab(text):
    """/etc/fstab -> [{"src", "path", "fstype", "opts"}] (comments and blank lines skipped)."""
    entries = []
    for line in (text or "").splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#") or len(fields) < 2:
            continue
        entries.append({
            "src": fields[0],
            "path": unescape_octal(fields[1]).rstrip("/") or "/",
            "fstype": fields[2] if len(fields) > 2 else "",
            "opts": fields[3] if len(fields) > 3 else "",
            "line": line.strip(),
        })
    return entries


def foreign_fstab_entries(entries, result, root="/"):
    """fstab lines for the mount point that name another filesystem than the one the role mounts."""
    if result.get("action") == "refuse" or not result.get("mount"):
        return []
    ours = {result["mount"]["src"]} | {f"UUID={u}" for u in result.get("replaced_filesystems") or []}
    existing = result.get("existing") or {}
    if existing.get("label"):
        ours.add("LABEL={}".format(existing["label"]))
    devices = set()
    for member in result.get("members") or []:
        devices |= {member["path"], member.get("cmd_path"), member.get("id")} | set(member.get("by_id") or [])
    if result.get("md_device"):
        devices.add(result["md_device"])
    foreign = []
    for entry in entries:
        if entry["path"] != result["mountpoint"]:
            continue
        src = entry["src"]
        if src in ours or src in devices:
            continue
        if src.startswith("/dev/") and root == "/" and os.path.realpath(src) in {os.path.realpath(d) for d in devices if d}:
            continue
        foreign.append(entry["line"])
    return foreign


def replaced_filesystems(wiped):
    """UUIDs of the XFS filesystems on drives about to be wiped: on the drive itself, or inside the md
    array it was a member of (at the member's data offset)."""
    found = set()
    for m in wiped:
        if m.get("xfs"):
            found.add(m["xfs"]["uuid"])
        md = m.get("md")
        if md and md.get("data_offset"):
            try:
                xfs = parse_xfs_super(read_at(m["path"], md["data_offset"], 4096))
            except OSError:
                xfs = None
            if xfs:
                found.add(xfs["uuid"])
    return sorted(found)


MDADM_MARKER = "provisioner storage: the data array"


def _uuid_hex(text):
    return re.sub(r"[^0-9a-f]", "", (text or "").lower())


def mdadm_conf_other_lines(text, md_uuid):
    """ARRAY lines for this array's UUID in mdadm.conf outside the role's own block (an admin's or
    mdadm's own mkconf): the array already has its name there, the role adds no second one."""
    found, inside = [], False
    for line in (text or "").splitlines():
        if MDADM_MARKER in line:
            inside = "BEGIN" in line
            continue
        if inside or not line.strip().startswith("ARRAY"):
            continue
        match = re.search(r"\bUUID=([0-9A-Fa-f:.-]+)", line)
        if match and md_uuid and _uuid_hex(match.group(1)) == _uuid_hex(md_uuid):
            found.append(line.strip())
    return found


def gather(params, root="/", probe=True):
    spec = {
        "level": params["level"],
        "backend": params["backend"],
        "md_name": params.get("md_name") or "data",
        "chunk_kb": int(params.get("chunk_kb") or MD_CHUNK_KB),
        "mountpoint": (params.get("mountpoint") or "/data").rstrip("/") or "/",
        "hostname": params.get("hostname") or socket.gethostname().split(".")[0],
        "udev": os.path.exists(path_in(root, "/run/udev/control")),
    }
    allow_unstable = bool(params.get("allow_unstable_names"))
    disks = list_disks(root)
    # By name, not ranked as the facts list them: a serial:/wwn: id's command path (fstab device=,
    # the udev rule, mdadm --create) is the alphabetically first link on hosts built so far.
    links = {kname: sorted(names) for kname, names in by_id_links(root).items()}
    try:
        with open(path_in(root, "/proc/self/mountinfo")) as handle:
            mounts = parse_mountinfo(handle.read())
    except OSError:
        mounts = []
    try:
        with open(path_in(root, "/proc/swaps")) as handle:
            swaps = parse_swaps(handle.read())
    except OSError:
        swaps = []

    problems, members, seen, absent = [], [], {}, []  # type: list[str], list[dict], dict[str, str], list[str]
    for spec_id in params.get("devices") or []:
        kname, error = resolve(spec_id, root, allow_unstable, disks, links)
        if error:
            problems.append("storage: " + error)
            if is_absent(error):
                absent.append(str(spec_id))
            continue
        if kname in seen:
            problems.append(f"storage: {seen[kname]} and {spec_id} are the same device ({kname})")
            continue
        seen[kname] = spec_id
        device = inspect_device(kname, root, mounts, swaps, probe=probe)
        device["id"] = str(spec_id)
        # The name used in commands: the configured by-id link, else a by-id link to the same drive,
        # else the kernel path (the drive was just resolved, names cannot move within a run).
        if str(spec_id).startswith("/dev/"):
            device["cmd_path"] = str(spec_id)
        else:
            device["cmd_path"] = (links.get(kname) or ["/dev/" + kname])[0]
        device["by_id"] = links.get(kname) or []
        members.append(device)

    wipe_knames = {}
    for spec_id in params.get("wipe_devices") or []:
        kname, error = resolve(spec_id, root, True, disks, links)
        if kname:
            wipe_knames[kname] = spec_id
    warnings = []
    for kname, spec_id in sorted(wipe_knames.items()):
        if kname not in seen:
            warnings.append(f"storage: storage_wipe_devices names {spec_id}, which is not in storage_devices; ignored")
    for m in members:
        m["wipe_allowed"] = m["kname"] in wipe_knames

    # Mounts of multi-device btrfs show one member as the source: map every mounted btrfs to
    # its fsid and mark all members carrying that fsid as mounted there.
    if probe:
        mounted_fsids: dict[str, list[str]] = {}
        for mount in mounts:
            if mount["fstype"] != "btrfs" or not mount["source"].startswith("/dev/"):
                continue
            try:
                sb = parse_btrfs_super(read_at(path_in(root, mount["source"]) if root != "/" else mount["source"],
                                               BTRFS_SUPER_OFFSET, 4096))
            except OSError:
                sb = None
            if sb:
                mounted_fsids.setdefault(sb["fsid"], []).append(mount["mountpoint"])
        for m in members:
            if m.get("btrfs") and m["btrfs"]["fsid"] in mounted_fsids:
                for point in mounted_fsids[m["btrfs"]["fsid"]]:
                    if point not in m["mountpoints"]:
                        m["mountpoints"].append(point)
        # btrfs profiles, read from the chunk tree of the members
        by_fsid: dict[str, dict] = {}
        for m in members:
            if m.get("btrfs"):
                by_fsid.setdefault(m["btrfs"]["fsid"], {})[m["btrfs"]["devid"]] = m["path"]
        for m in members:
            if m.get("btrfs"):
                try:
                    m["btrfs_profiles"] = btrfs_profiles(by_fsid[m["btrfs"]["fsid"]], m["btrfs"])
                except (OSError, struct.error):
                    m["btrfs_profiles"] = None

    arrays = md_arrays(root)
    # Mounts and filesystem of a running md array count for its members.
    for m in members:
        for holder in m.get("holders") or []:
            array = arrays.get(holder)
            if array:
                m["mountpoints"] += [x["mountpoint"] for x in mounts if x["majmin"] == array["majmin"]]

    state = _mountpoint_state(spec["mountpoint"], mounts, root)
    # The role's own array running degraded: drives not on the host are its lost members (the
    # decision says so as a warning), not a refusal.
    named = named_array(root, spec["md_name"], arrays) if spec["backend"] == "mdadm" else None
    missing = []
    if named and len(problems) == len(absent) and degraded_context(spec, len(params.get("devices") or []), arrays, named):
        missing, problems = absent, []
        if probe:
            try:
                xfs = parse_xfs_super(read_at("/dev/" + named, 0, 4096))
            except OSError:
                xfs = None
            arrays[named]["filesystem"] = {"kind": "xfs", "uuid": xfs["uuid"]} if xfs else None
    if problems:
        result = decide(spec, [], arrays, state, md_driver(root))
        result["refusals"] = problems
        result["missing"] = []
        result["members"] = members
        result["warnings"] += warnings
        return result

    # An md array over the members: what filesystem does it hold (read from the array, or for one
    # not running yet from the first member's data area)?
    if spec["backend"] == "mdadm" and spec["level"] != "single" and probe:
        ok, info = match_md(members, spec, arrays)
        if ok:
            fs = None
            try:
                if info["running"]:
                    buf = read_at("/dev/" + info["running"], 0, 4096)
                elif info["first_member"]:
                    buf = read_at(info["first_member"], info["data_offset"], 4096)
                else:
                    buf = b""
                xfs = parse_xfs_super(buf)
                if xfs:
                    fs = {"kind": "xfs", "uuid": xfs["uuid"]}
                elif info["running"]:
                    sigs, _ = signatures_of("/dev/" + info["running"])
                    if sigs:
                        fs = {"kind": sigs[0]["type"] or "unknown", "uuid": sigs[0].get("uuid")}
            except OSError:
                pass
            for m in members:
                if m.get("md"):
                    m["md"]["filesystem"] = fs
    result = decide(spec, members, arrays, state, md_driver(root), missing=missing, named=named)
    result["warnings"] += warnings
    result["missing"] = missing
    # Filesystems on drives about to be wiped (storage_wipe_devices): an fstab line of theirs at
    # the mount point is the old layout the new one replaces, not a foreign mount.
    wiped = set(result["wipe"]) if result["action"] != "refuse" else set()
    result["replaced_filesystems"] = replaced_filesystems([m for m in members if m["id"] in wiped] if probe else [])
    result["udev_rules_dir_existed"] = os.path.isdir(path_in(root, "/etc/udev/rules.d"))
    result["mdadm_conf_other_lines"] = []
    if result.get("md_uuid"):
        try:
            with open(path_in(root, "/etc/mdadm/mdadm.conf")) as handle:
                result["mdadm_conf_other_lines"] = mdadm_conf_other_lines(handle.read(), result["md_uuid"])
        except OSError:
            pass
    # What undo restores: the members' live read-ahead and scheduler as found.
    result["live"] = dict(
        (m["cmd_path"], {"kname": m["kname"], "read_ahead_kb": m["read_ahead_kb"], "scheduler": m["scheduler"]})
        for m in members
    )
    try:
        with open(path_in(root, "/etc/fstab")) as handle:
            fstab = parse_fstab(handle.read())
    except OSError:
        fstab = []
    foreign = foreign_fstab_entries(fstab, result, root)
    if foreign:
        result["action"] = "refuse"
        result["refusals"].append(
            "storage: /etc/fstab already mounts something else at {} ({}) — remove that line or choose another "
            "storage_mountpoint".format(spec["mountpoint"], " | ".join(foreign)))
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            devices=dict(type="list", elements="str", required=True),
            wipe_devices=dict(type="list", elements="str", default=[]),
            allow_unstable_names=dict(type="bool", default=False),
            level=dict(type="str", required=True, choices=list(STORAGE_LEVELS)),
            backend=dict(type="str", required=True, choices=list(STORAGE_BACKENDS)),
            md_name=dict(type="str", default="data"),
            chunk_kb=dict(type="int", default=MD_CHUNK_KB),
            mountpoint=dict(type="path", default="/data"),
            hostname=dict(type="str"),
            root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    root = module.params["root"]
    if root == "/" and os.geteuid() != 0:
        module.fail_json(msg="provisioner_storage needs root to read the drives (become: true)")
    result = gather(module.params, root=root, probe=root == "/")
    module.exit_json(changed=False, storage=result)


if __name__ == "__main__":
    main()
