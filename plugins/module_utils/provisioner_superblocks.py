# Copyright: provisioner contributors
# Apache License 2.0 (see pyproject.toml)
"""The superblocks the storage module reads itself, bypassing the page cache (read_at, O_DIRECT):
btrfs (fsid, label, devid, num_devices, the chunk tree's data/metadata profiles), md 1.2 (array
UUID, name, level, raid_disks, chunk, data offset, this member's role) and XFS (UUID, label).

What wipefs and blkid report is read from them (provisioner_drives: every signature, a drive's own
XFS). A raw read stays only where no tool on the host reports the field:
- btrfs devid, num_devices and the data/metadata profiles: blkid reports the filesystem's and the
  device's UUIDs and the label only; btrfs-progs (inspect-internal dump-super) is not on a fresh
  host when the plan and the first run inspect its drives;
- md level, raid_disks, chunk, data offset and role: blkid reports the array UUID, the member UUID
  and the name only; mdadm --examine is not on a fresh host either;
- the XFS inside an md array (at a member's data offset, or on the array's device): md writes to
  its members below their page cache, so only an O_DIRECT read sees what the array last wrote.

Standard library only (python3 3.8 and later); no import of the other module_utils.
"""

import errno
import mmap
import os
import struct
import uuid

MD_LEVEL_NAME = {0: "raid0", 1: "raid1", 10: "raid10", 4: "raid4", 5: "raid5", 6: "raid6", -1: "linear"}

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
