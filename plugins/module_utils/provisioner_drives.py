# Copyright: provisioner contributors
# Apache License 2.0 (see pyproject.toml)
"""The drives of the target by name, for both modules that read them: provisioner_facts (what the
plan proposes from) and provisioner_storage (what it builds on).

- by_id_links: /dev/disk/by-id links per kernel name, best first (the shared BY_ID_RANK);
- list_disks: every whole block device under /sys/block with its serial and WWID;
- resolve: an id as storage_devices accepts it (by-id link, serial:, wwn:, kernel name) -> kernel name;
- parse_swaps: the block devices in use as swap;
- probe: what a drive holds, from util-linux's wipefs (every signature) and blkid -p (the
  first one, with its tags), through the pure parsers parse_wipefs_json and parse_blkid_export;
- inspect_device, md_arrays, named_array, md_driver, mountpoint_state, replaced_filesystems: one
  drive as the storage module decides on it (with the superblocks of provisioner_superblocks), the
  running md arrays, the md driver, the mount point, the XFS filesystems on drives to be wiped.

Runs on the target inside the modules (standard library only, python3 3.8 and later); ``root``
other than "/" reads a fake tree (tests).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import struct

# Siblings in the same module_utils package, by either name Ansible gives it (ansible.module_utils from the
# checkout, ansible_collections.provisioner.ml.plugins.module_utils installed). Absolute names only: Mitogen's module finder does not follow relative imports.
try:  # installed as the provisioner.ml collection
    from ansible_collections.provisioner.ml.plugins.module_utils import provisioner_superblocks as superblocks
    from ansible_collections.provisioner.ml.plugins.module_utils.provisioner_common import path_in, read_line, run, to_int
    from ansible_collections.provisioner.ml.plugins.module_utils.provisioner_drive_rules import (
        norm_serial,
        norm_wwn,
        sort_by_id,
    )
except ImportError:  # run from the repository: ansible.cfg and the CLI put plugins/module_utils on the path
    from ansible.module_utils import provisioner_superblocks as superblocks  # type: ignore[no-redef]
    from ansible.module_utils.provisioner_common import path_in, read_line, run, to_int
    from ansible.module_utils.provisioner_drive_rules import norm_serial, norm_wwn, sort_by_id


def parse_swaps(text):
    """/proc/swaps -> the block devices in use as swap (swap files are not drives)."""
    lines = (text or "").splitlines()[1:]
    return [line.split()[0] for line in lines if line.split() and line.split()[1] == "partition"]


def by_id_links(root="/"):
    """kernel name -> [/dev/disk/by-id/... links to it], best first (sort_by_id). A -partN link names
    the partition's kernel name, never a whole drive's."""
    result: dict[str, list[str]] = {}
    directory = path_in(root, "/dev/disk/by-id")
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return result
    for name in names:
        full = os.path.join(directory, name)
        try:
            target = os.path.realpath(full) if root == "/" else os.readlink(full)
        except OSError:
            continue
        result.setdefault(os.path.basename(target), []).append("/dev/disk/by-id/" + name)
    return {kname: sort_by_id(links) for kname, links in result.items()}


def list_disks(root="/"):
    """Whole block devices (not partitions, not ram/zram) -> {kname: {"serial", "wwid"}}."""
    disks = {}
    for entry in sorted(glob.glob(path_in(root, "/sys/block/*"))):
        name = os.path.basename(entry)
        if name.startswith(("ram", "zram")):
            continue
        base = "/sys/block/" + name
        disks[name] = {
            "serial": read_line(root, base + "/device/serial") or read_line(root, base + "/serial"),
            "wwid": read_line(root, base + "/wwid") or read_line(root, base + "/device/wwid"),
        }
    return disks


def resolve(spec, root="/", allow_unstable=False, disks=None, links=None):
    """A configured id -> (kname, None) or (None, one-line reason)."""
    spec = str(spec).strip()
    disks = disks if disks is not None else list_disks(root)
    if spec.startswith("serial:"):
        wanted = norm_serial(spec[len("serial:") :])
        hits = sorted(k for k, d in disks.items() if wanted and norm_serial(d.get("serial")) == wanted)
        return _one(spec, hits)
    if spec.startswith("wwn:"):
        wanted = norm_wwn(spec[len("wwn:") :])
        hits = sorted(k for k, d in disks.items() if wanted and norm_wwn(d.get("wwid")) == wanted)
        return _one(spec, hits)
    if spec.startswith("/dev/disk/by-id/"):
        link = path_in(root, spec)
        if not os.path.lexists(link):
            return None, f"{spec} does not exist on this host (see ls -l /dev/disk/by-id)"
        target = os.path.realpath(link) if root == "/" else os.path.join(os.path.dirname(spec), os.readlink(link))
        kname = os.path.basename(os.path.normpath(target))
        if kname not in disks:
            if os.path.exists(path_in(root, f"/sys/class/block/{kname}/partition")):
                return None, f"{spec} is a partition ({kname}); name the whole drive"
            return None, f"{spec} points to {kname}, which is not a whole block device"
        return kname, None
    if spec.startswith("/dev/") and "/" not in spec[len("/dev/") :]:
        kname = spec[len("/dev/") :]
        if not allow_unstable:
            stable = (links or {}).get(kname) or []
            hint = (f"name it {stable[0]}") if stable else "name it by /dev/disk/by-id/..., serial:... or wwn:..."
            return None, (
                f"{spec} is a kernel name, which can change across reboots — {hint} "
                "(storage_allow_unstable_names: true is for tests and VMs only)"
            )
        if kname not in disks:
            if os.path.exists(path_in(root, f"/sys/class/block/{kname}/partition")):
                return None, f"{spec} is a partition; name the whole drive"
            return None, f"{spec} is not a block device on this host"
        return kname, None
    return None, f"{spec} is not a stable device id: use /dev/disk/by-id/..., serial:XYZ or wwn:0x..."


# The reasons resolve() gives for an id whose drive is not on the host at all (pulled, failed).
ABSENT_REASONS = ("does not exist on this host", "matches no block device on this host")


def is_absent(reason):
    return any(text in (reason or "") for text in ABSENT_REASONS)


def _one(spec, hits):
    if not hits:
        return None, f"{spec} matches no block device on this host"
    if len(hits) > 1:
        return None, "{} matches several block devices ({})".format(spec, ", ".join(hits))
    return hits[0], None


# --------------------------------------------------------------------------
# what a drive holds: wipefs and blkid
# --------------------------------------------------------------------------

# The blkid -p tags kept (libblkid: btrfs LABEL/UUID/UUID_SUB, xfs LABEL/UUID, md UUID/UUID_SUB/
# LABEL/VERSION, partition tables PTTYPE/PTUUID).
BLKID_TAGS = ("TYPE", "UUID", "UUID_SUB", "LABEL", "VERSION", "PTTYPE", "PTUUID", "USAGE")


def parse_wipefs_json(text):
    """``wipefs --no-act --json`` -> [{"type", "label", "uuid", "offset"}] (every signature wipefs
    finds, an md member's and the older filesystem under it alike), or None when it is not JSON.
    No output at all (older wipefs on a blank drive) is no signature."""
    if not (text or "").strip():
        return []
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return [
        {"type": sig.get("type"), "label": sig.get("label"), "uuid": sig.get("uuid"), "offset": sig.get("offset")}
        for sig in data.get("signatures") or []
    ]


def parse_blkid_export(returncode, stdout, stderr):
    """``blkid -p -o export`` -> {"tags": {KEY: value}, "ambiguous": bool, "error": None | reason}.

    blkid exits 0 when it found something, 2 when nothing (or on an error, which it prints), 8 when
    the result is ambivalent (several signatures: the drive holds something; wipefs lists them)."""
    tags: dict = {}
    for line in (stdout or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key in BLKID_TAGS and value:
            tags[key] = value
    if returncode == 8:
        return {"tags": tags, "ambiguous": True, "error": None}
    if returncode == 2 and not (stderr or "").strip():
        return {"tags": {}, "ambiguous": False, "error": None}
    if returncode != 0:
        return {"tags": {}, "ambiguous": False,
                "error": "blkid -p failed: {}".format((stderr or "").strip() or f"exit {returncode:d}")}
    return {"tags": tags, "ambiguous": False, "error": None}


def blkid_entries(tags, ambiguous):
    """The one signature blkid names, as a wipefs entry (no offset): [] when it names none."""
    kind = tags.get("TYPE") or tags.get("PTTYPE") or ("ambiguous" if ambiguous else None)
    if not kind:
        return []
    return [{"type": kind, "label": tags.get("LABEL"), "uuid": tags.get("UUID"), "offset": None}]


def probe(path, offset=None, wipefs=True, tags=True):
    """What one drive (or the data at ``offset`` bytes on it) holds.

    -> {"entries": [{"type", "label", "uuid", "offset"}] or None, "tags": blkid's, "ambiguous",
    "error": why it could not be probed, or None}. ``entries`` are wipefs's when it ran (not with an
    offset), else the one blkid names; ``error`` is set only when neither gave an answer. With
    ``tags`` False blkid runs only when wipefs gave no answer."""
    result: dict = {"entries": None, "tags": {}, "ambiguous": False, "error": None}
    if wipefs and offset is None:
        proc = run(["wipefs", "--no-act", "--json", path])
        if proc is not None and proc.returncode == 0:
            result["entries"] = parse_wipefs_json(proc.stdout)
    if result["entries"] is not None and not tags:
        return result
    argv = ["blkid", "-p"] + (["-O", str(offset)] if offset is not None else []) + ["-o", "export", path]
    proc = run(argv)
    found: dict
    if proc is None:
        found = {"tags": {}, "ambiguous": False, "error": "neither wipefs nor blkid is installed (util-linux)"}
        if not wipefs or offset is not None:
            found["error"] = "blkid is not installed (util-linux)"
    else:
        found = parse_blkid_export(proc.returncode, proc.stdout, proc.stderr)
    result["tags"], result["ambiguous"] = found["tags"], found["ambiguous"]
    if result["entries"] is None:
        result["error"] = found["error"]
        result["entries"] = None if found["error"] else blkid_entries(found["tags"], found["ambiguous"])
    return result


# --------------------------------------------------------------------------
# one drive as the storage module sees it, the md arrays
# --------------------------------------------------------------------------


def signatures_of(path):
    """Every signature on a device: wipefs -n -J (all of them), blkid -p as the fall-back
    (provisioner_drives.probe). Returns (list of {"type", "label", "uuid", "offset"}, None) or (None, reason)."""
    found = probe(path, tags=False)
    if found["error"]:
        return None, found["error"]
    return found["entries"], None


def xfs_of(signatures):
    """The XFS a drive carries at its start, as wipefs (or blkid) reported it -> {"uuid", "label"}, or None."""
    for sig in signatures:
        if sig.get("type") == "xfs" and sig.get("offset") in ("0x0", 0, None):
            return {"uuid": sig.get("uuid"), "label": sig.get("label") or ""}
    return None


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
    device["xfs"] = xfs_of(device["signatures"])
    # What wipefs and blkid do not report (provisioner_superblocks says which fields, and why).
    for name, offset, parser in (
        ("btrfs", superblocks.BTRFS_SUPER_OFFSET, superblocks.parse_btrfs_super),
        ("md", superblocks.MD_SUPER_1_2_OFFSET, superblocks.parse_md_super),
    ):
        try:
            device[name] = parser(superblocks.read_at(path, offset, 4096))
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


def mountpoint_state(path, mounts, root="/"):
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
                xfs = superblocks.parse_xfs_super(superblocks.read_at(m["path"], md["data_offset"], 4096))
            except OSError:
                xfs = None
            if xfs:
                found.add(xfs["uuid"])
    return sorted(found)
