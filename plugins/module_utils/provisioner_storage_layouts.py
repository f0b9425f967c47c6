# Copyright: provisioner contributors
# Apache License 2.0 (see pyproject.toml)
"""The layouts the storage module makes, one class each (as linux-system-roles/storage keeps one
class per volume type): XFS on one drive, btrfs over the drives, and an md array with XFS. Each
says what of the drives' contents it adopts (match) and the commands that make it (build); the
module's decide() does what is common (the drive counts, drives in use, the mount point, wiping)
and picks the layout with layout_of. Pure: the drives as inspected in, commands out.

Standard library only (python3 3.8 and later).
"""

import uuid

# Siblings in the same module_utils package, by either name Ansible gives them (ansible.module_utils from the
# checkout, ansible_collections.provisioner.ml.plugins.module_utils installed). Absolute names only: Mitogen's
# module finder does not follow relative imports.
try:  # installed as the provisioner.ml collection
    from ansible_collections.provisioner.ml.plugins.module_utils import provisioner_drive_arrays as drive_arrays
    from ansible_collections.provisioner.ml.plugins.module_utils import provisioner_drive_rules as drive_rules
    from ansible_collections.provisioner.ml.plugins.module_utils import provisioner_superblocks as superblocks
except ImportError:  # run from the repository: ansible.cfg and the CLI put plugins/module_utils on the path
    from ansible.module_utils import provisioner_drive_arrays as drive_arrays  # type: ignore[no-redef]
    from ansible.module_utils import provisioner_drive_rules as drive_rules  # type: ignore[no-redef]
    from ansible.module_utils import provisioner_superblocks as superblocks  # type: ignore[no-redef]


class Layout:
    """A layout: the filesystem it mounts, what it adopts of the drives' contents and how it is made."""

    filesystem = "xfs"

    @staticmethod
    def match(spec, members, arrays, missing, named, result):
        """What the drives already hold that this layout adopts: {"fs": ...} or {"md": ..., "repair": ...}, or {}."""
        raise NotImplementedError

    @staticmethod
    def build(spec, members, found, result, commands, force):
        """Appends the commands that make (or adopt) the layout; returns the result's md_uuid, fs_uuid,
        md_device and fs_device, or the refused result."""
        raise NotImplementedError


class Xfs(Layout):
    """XFS straight on one drive (level single with the mdadm backend)."""

    @staticmethod
    def match(spec, members, arrays, missing, named, result):
        if len(members) == 1:
            xfs = members[0].get("xfs")
            sigs = [s.get("type") for s in members[0].get("signatures") or []]
            if xfs and set(sigs) <= {"xfs"} and not members[0].get("partitions"):
                return {"fs": {"kind": "xfs", "uuid": xfs["uuid"], "label": xfs["label"]}}
        return {}

    @staticmethod
    def build(spec, members, found, result, commands, force):
        fs_uuid = adopt_or_create(result, found.get("fs"), "xfs", members, spec)
        if not found.get("fs"):
            commands.append({"argv": mkfs_xfs(spec["md_name"], fs_uuid, None, None, spec["level"], force, members[0]["cmd_path"]),
                             "why": "create XFS directly on {}".format(members[0]["id"])})
        return None, fs_uuid, None, members[0]["cmd_path"]


class Btrfs(Layout):
    """One btrfs filesystem over every drive, its data and metadata profiles from the level."""

    filesystem = "btrfs"

    @staticmethod
    def match(spec, members, arrays, missing, named, result):
        ok, what = drive_arrays.match_btrfs(members, spec)
        if ok is False:
            result["mismatch"] = what
        return {"fs": what} if ok else {}

    @staticmethod
    def build(spec, members, found, result, commands, force):
        paths = [m["cmd_path"] for m in members]
        fs_uuid = adopt_or_create(result, found.get("fs"), "btrfs", members, spec)
        if not found.get("fs"):
            data, meta = result["btrfs_data_profile"], result["btrfs_metadata_profile"]
            argv = ["mkfs.btrfs"] + (["--force"] if force else []) + [
                "--label", spec["md_name"], "--uuid", fs_uuid, "--data", data, "--metadata", meta] + paths
            commands.append({"argv": argv, "why": f"create btrfs data {data}, metadata {meta} over {len(members):d} drive(s)"})
        return None, fs_uuid, None, paths[0]


class Md(Layout):
    """An md array (raid0, raid1, raid10) with XFS aligned to its chunk and data drives; a degraded
    array of ours is repaired with the drives storage_devices names."""

    @staticmethod
    def match(spec, members, arrays, missing, named, result):
        repair = drive_arrays.match_degraded(spec, members, missing, arrays, named)
        if repair is not None:
            Md.note_degraded(spec, repair, result)
            return {"md": repair["info"], "repair": repair}
        ok, what = drive_arrays.match_md(members, spec, arrays)
        if ok is False:
            result["mismatch"] = what
        return {"md": what} if ok else {}

    @staticmethod
    def note_degraded(spec, repair, result):
        """A degraded array of ours: its refusals, the replacements to wipe, its state, and a warning when
        nothing named can take a lost member's place."""
        result["refusals"].extend(repair["refusals"])
        result["wipe"] = [m for m in repair["replacements"] if drive_rules.has_contents(m)]
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
            result["warnings"].append(
                "storage: the data array {} ({}) runs degraded on {:d} of {:d} drives, {} not on this host — put the "
                "drive back, or list a blank drive in its place in storage_devices, then run up again".format(
                    repair["device"], spec["level"], repair["active"], repair["raid_disks"],
                    ", ".join(repair["missing"])))

    @staticmethod
    def build(spec, members, found, result, commands, force):
        level = spec["level"]
        sw = {"raid0": len(members), "raid10": len(members) // 2, "raid1": 1}[level]
        chunk = spec["chunk_kb"]
        if found.get("md"):
            built = Md.adopt(spec, members, found, result, commands, force, sw)
            if isinstance(built, dict):
                return built
            md_uuid, fs_uuid, md_device, chunk = built
        else:
            result["action"] = "create"
            md_device = result["md_device"]
            md_uuid = superblocks.md_uuid_text(uuid.UUID(drive_arrays.planned_uuid("md", members, spec)).bytes)
            fs_uuid = drive_arrays.planned_uuid("xfs", members, spec)
            argv = ["mdadm", "--create", md_device, "--run", "--metadata=1.2", f"--level={level}",
                    f"--raid-devices={len(members):d}"]
            if level != "raid1":
                argv.append(f"--chunk={chunk:d}")
            argv += ["--name={}".format(spec["md_name"]), "--homehost={}".format(spec.get("hostname", "any")),
                     f"--uuid={md_uuid}", *(m["cmd_path"] for m in members)]
            commands.append({"argv": argv, "why": f"create md {level} over {len(members):d} drive(s)"})
            commands += udev_settle(spec, md_device)
            commands.append({"argv": mkfs_xfs(spec["md_name"], fs_uuid, chunk, sw, level, force, md_device),
                             "why": f"create XFS aligned to the {chunk:d} KiB chunk x {sw:d} data drive(s)"})
        result["chunk_kb"] = chunk
        result["stripe_width"] = sw
        return md_uuid, fs_uuid, md_device, md_device

    @staticmethod
    def adopt(spec, members, found, result, commands, force, sw):
        """An existing array: assembled if stopped, its XFS adopted or made, a degraded one repaired.
        Returns (md_uuid, fs_uuid, md_device, the chunk in KiB), or a refused result."""
        adopt_md, level, md_device = found["md"], spec["level"], result["md_device"]
        md_uuid = adopt_md["uuid"]
        result["existing"] = adopt_md
        chunk = spec["chunk_kb"]
        if adopt_md["chunk_kb"] and level != "raid1" and adopt_md["chunk_kb"] != chunk:
            result["warnings"].append("storage: the existing array has a {:d} KiB chunk, storage_chunk_kb is {:d}; adopted as it is"
                                      .format(adopt_md["chunk_kb"], chunk))
            chunk = adopt_md["chunk_kb"]
        if not adopt_md["running"]:
            commands.append({"argv": ["mdadm", "--assemble", md_device, f"--uuid={md_uuid}", *(m["cmd_path"] for m in members)],
                             "why": f"assemble the existing {level} array {md_uuid}"})
            commands += udev_settle(spec, md_device)
        fs = adopt_md.get("filesystem")
        ours = md_uuid == superblocks.md_uuid_text(uuid.UUID(drive_arrays.planned_uuid("md", members, spec)).bytes)
        if fs and fs.get("kind") == "xfs" and ours and fs.get("uuid") != drive_arrays.planned_uuid("xfs", members, spec):
            # Storage made this array but not this filesystem: a create stopped between mdadm and
            # mkfs leaves the drives' earlier XFS superblock showing through the new array.
            leftover = "storage: the array {} that storage created holds an XFS (UUID {}) that storage did not make".format(
                md_uuid, fs.get("uuid"))
            if not any(m.get("wipe_allowed") for m in members):
                return refuse(result, leftover + " (left from the drives' earlier contents, or made by hand) — "
                               "add its drives to storage_wipe_devices to make the filesystem again, or mount it by hand")
            result["warnings"].append(leftover + "; made again, as storage_wipe_devices allows")
            fs, force = None, True
        if fs and fs.get("kind") == "xfs":
            result["action"] = "adopt" if adopt_md["running"] else "assemble"
            fs_uuid = fs["uuid"]
        elif fs:
            return refuse(result, "storage: refusing to adopt array {}: it holds a {} filesystem, not XFS — wipe it "
                                   "by hand if it may go".format(md_uuid, fs.get("kind")))
        else:
            result["action"] = "mkfs" if adopt_md["running"] else "assemble"
            fs_uuid = drive_arrays.planned_uuid("xfs", members, spec)
            commands.append({"argv": mkfs_xfs(spec["md_name"], fs_uuid, chunk, sw, level, force, md_device),
                             "why": "create XFS on the existing array (it holds no filesystem)"})
        if adopt_md["running"]:
            md_device = "/dev/" + adopt_md["running"]
        if found.get("repair") is not None and result["action"] == "adopt":
            Md.repair(found["repair"], md_device, md_uuid, commands, result)
        return md_uuid, fs_uuid, md_device, chunk

    @staticmethod
    def repair(repair, md_device, md_uuid, commands, result):
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


# The layouts by the key layout_of gives.
LAYOUTS = {"xfs": Xfs, "btrfs": Btrfs, "md": Md}


def layout_of(spec):
    """The LAYOUTS key of storage_backend and storage_level: btrfs, md, or xfs on one drive."""
    if spec["backend"] == "btrfs":
        return "btrfs"
    return "xfs" if spec["level"] == "single" else "md"


def adopt_or_create(result, adopt_fs, kind, members, spec):
    """The UUID of the filesystem straight on the drives (btrfs, or XFS on one drive): the one adopted
    (ADOPT_FS, what the drives carry) or the planned one of a new filesystem of KIND; sets the action."""
    if adopt_fs:
        result["action"] = "adopt"
        result["existing"] = adopt_fs
        return adopt_fs["uuid"]
    result["action"] = "create"
    return drive_arrays.planned_uuid(kind, members, spec)


def refuse(result, message):
    result["action"] = "refuse"
    result["refusals"].append(message)
    return result


def udev_settle(spec, md_device):
    """Where udev runs, it names a started array (/dev/md/NAME): under load that can take longer
    than mdadm waits, and the next command (mkfs, blkid) would not find the name."""
    if not spec.get("udev"):
        return []
    return [{"argv": ["udevadm", "settle", "--timeout=120"], "why": f"wait until udev has named the array {md_device}"}]


def mkfs_xfs(label, fs_uuid, chunk, sw, level, force, device):
    argv = ["mkfs.xfs"] + (["-f"] if force else []) + ["-L", label, "-m", f"uuid={fs_uuid}"]
    if chunk and level in ("raid0", "raid10"):
        argv += ["-d", f"su={chunk:d}k,sw={sw:d}"]
    return [*argv, device]
