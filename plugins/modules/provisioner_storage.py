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

import os
import re
import socket
import struct

try:
    from ansible.module_utils.basic import AnsibleModule
except ImportError:  # imported by the tests without ansible on the path
    AnsibleModule = None

# Shared code (plugins/module_utils), by module: its names are written once, where they are used.
try:  # installed as the provisioner.ml collection
    from ansible_collections.provisioner.ml.plugins.module_utils import provisioner_common as common
    from ansible_collections.provisioner.ml.plugins.module_utils import provisioner_constants as constants
    from ansible_collections.provisioner.ml.plugins.module_utils import provisioner_drive_arrays as drive_arrays
    from ansible_collections.provisioner.ml.plugins.module_utils import provisioner_drive_rules as drive_rules
    from ansible_collections.provisioner.ml.plugins.module_utils import provisioner_drives as drives
    from ansible_collections.provisioner.ml.plugins.module_utils import provisioner_storage_layouts as layouts
    from ansible_collections.provisioner.ml.plugins.module_utils import provisioner_superblocks as superblocks
except ImportError:  # run from the repository: ansible.cfg and the CLI put plugins/module_utils on the path
    # (the same files under another name: mypy sees two modules)
    from ansible.module_utils import provisioner_common as common  # type: ignore[no-redef]
    from ansible.module_utils import provisioner_constants as constants  # type: ignore[no-redef]
    from ansible.module_utils import provisioner_drive_arrays as drive_arrays  # type: ignore[no-redef]
    from ansible.module_utils import provisioner_drive_rules as drive_rules  # type: ignore[no-redef]
    from ansible.module_utils import provisioner_drives as drives  # type: ignore[no-redef]
    from ansible.module_utils import provisioner_storage_layouts as layouts  # type: ignore[no-redef]
    from ansible.module_utils import provisioner_superblocks as superblocks  # type: ignore[no-redef]




# --------------------------------------------------------------------------
# the decision (pure)
# --------------------------------------------------------------------------


def decide(spec, members, arrays=None, mountpoint_state=None, md_state=("loaded", ""), missing=(), named=None):
    """The whole decision from inspected members. Pure; returns the ``storage`` result."""
    arrays = arrays or {}
    mountpoint_state = mountpoint_state or {}
    level, name = spec["level"], spec["md_name"]
    layout = layouts.LAYOUTS[layouts.layout_of(spec)]
    uses_md = layout is layouts.Md
    result = {
        "level": level,
        "backend": spec["backend"],
        "filesystem": layout.filesystem,
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
        "refusals": [],
        "warnings": [],
    }
    refusals = result["refusals"]
    refusals += _count_refusals(spec, len(members) + len(missing), uses_md)  # a drive not on the host (lost) is still named

    # Drives in any use are refused outright; wiping does not cover them (the shared rules' findings:
    # provisioner_drive_rules.py).
    findings = [dict(drive_rules.findings(m)) for m in members]
    for m, kinds in zip(members, findings):
        who = drive_arrays.member_text(m)
        if "unprobed" in kinds:
            refusals.append("storage: refusing {}: could not be inspected ({}) — fix that first".format(who, kinds["unprobed"]))
        if "read_only" in kinds:
            refusals.append(f"storage: refusing {who}: the device is read-only")
        if "empty" in kinds:
            refusals.append(f"storage: refusing {who}: size 0 (no medium?)")

    found = layout.match(spec, members, arrays, missing, named, result)
    adopted = found.get("fs") or found.get("md")
    adopted_mounts = set()
    if adopted:
        for m in members:
            adopted_mounts |= set(m.get("mountpoints") or [])
    _in_use_refusals(members, findings, found, result)
    if adopted:
        points = sorted(adopted_mounts)
        if points and spec["mountpoint"] not in points:
            refusals.append(
                "storage: refusing to adopt the existing {} on {}: it is mounted at {}, not at {} — unmount it, or set "
                "storage_mountpoint: {}".format(
                    adopted["kind"], ", ".join(drive_arrays.member_text(m) for m in members), ", ".join(points),
                    spec["mountpoint"], points[0]))
    refusals += _mountpoint_refusals(spec, mountpoint_state, adopted_mounts)
    if refusals:
        return result

    data_profile, meta_profile = drive_arrays.profile_for(level, len(members))
    result["btrfs_data_profile"] = data_profile if layout is layouts.Btrfs else None
    result["btrfs_metadata_profile"] = meta_profile if layout is layouts.Btrfs else None
    commands = _wipe_commands(result["wipe"])
    built = layout.build(spec, members, found, result, commands, bool(result["wipe"]))
    if isinstance(built, dict):  # refused
        return built
    md_uuid, fs_uuid, md_device, fs_device = built
    return _finish(spec, members, result, commands, md_uuid, fs_uuid, md_device, fs_device)


def _count_refusals(spec, named_count, uses_md):
    level, refusals = spec["level"], []
    need = constants.MIN_DRIVES[level]
    if named_count < need:
        refusals.append(f"storage: {level} needs at least {need:d} device(s), storage_devices names {named_count:d}")
    if spec["backend"] == "mdadm" and level == "single" and named_count != 1:
        refusals.append(f"storage: level single with the mdadm backend puts XFS on one drive; storage_devices names {named_count:d}")
    if level == "raid10" and uses_md and named_count % 2:
        refusals.append(f"storage: raid10 needs an even number of drives, storage_devices names {named_count:d}")
    return refusals


def _in_use_refusals(members, findings, found, result):
    """A drive mounted or held outside what is adopted is refused; one with contents is wiped when
    storage_wipe_devices allows it, else refused."""
    adopted = found.get("fs") or found.get("md")
    for m, kinds in zip(members, findings):
        who = drive_arrays.member_text(m)
        points = kinds.get("mounted") or []
        if points and not adopted:
            hint = " (the root disk)" if any(p in constants.SYSTEM_MOUNTPOINTS for p in points) else ""
            result["refusals"].append(
                "storage: refusing {}: mounted at {}{} — unmount it first; storage never unmounts or wipes a mounted "
                "drive, not even one in storage_wipe_devices".format(who, ", ".join(points), hint))
            continue
        if "held" in kinds and not found.get("md"):
            result["refusals"].append(
                "storage: refusing {}: in use by {} — stop that first (e.g. mdadm --stop /dev/{}); storage never "
                "stops arrays, not even for storage_wipe_devices".format(who, ", ".join(kinds["held"]), kinds["held"][0]))
            continue
        if adopted:
            continue
        if "partitions" in kinds or "signatures" in kinds:
            what = drive_rules.describe_contents(m)
            if m.get("wipe_allowed"):
                result["wipe"].append(m)
            else:
                # A btrfs/md signature of something other than the requested layout: say how it differs.
                why = result.get("mismatch") if (m.get("btrfs") or m.get("md")) else None
                result["refusals"].append("storage: refusing {}: holds {}{} — {}".format(
                    who, what, (f"; {why}") if why else "", drive_arrays.WIPE_HINT))


def _mountpoint_refusals(spec, mountpoint_state, adopted_mounts):
    """The mount point: nothing else mounted there, nothing hidden by mounting over it."""
    other = mountpoint_state.get("mounted_source")
    if mountpoint_state.get("mounted") and spec["mountpoint"] not in adopted_mounts:
        return ["storage: storage_mountpoint {} is already a mount of {} ({}) — choose another mount point or unmount it".format(
            spec["mountpoint"], other or "?", mountpoint_state.get("mounted_fstype") or "?")]
    if not mountpoint_state.get("mounted") and mountpoint_state.get("entries"):
        return ["storage: storage_mountpoint {} is a directory with {:d} entr{} — mounting the array there would hide them; "
                "move them or choose another mount point".format(
                    spec["mountpoint"], mountpoint_state["entries"], "y" if mountpoint_state["entries"] == 1 else "ies")]
    if mountpoint_state.get("not_a_directory"):
        return ["storage: storage_mountpoint {} exists and is not a directory".format(spec["mountpoint"])]
    return []


def _wipe_commands(wipe):
    commands = []
    for m in wipe:
        for part in m.get("partitions") or []:
            commands.append({"argv": ["wipefs", "--all", "/dev/" + part],
                             "why": "wipe {} on {} (storage_wipe_devices)".format(part, m["id"])})
        commands.append({"argv": ["wipefs", "--all", m["cmd_path"]],
                         "why": "wipe {}: {} (storage_wipe_devices)".format(m["id"], drive_rules.describe_contents(m))})
        if m.get("partitions"):
            commands.append({"argv": ["blockdev", "--rereadpt", m["cmd_path"]],
                             "why": "drop the wiped partitions of {} from the kernel".format(m["id"])})
    return commands


def _finish(spec, members, result, commands, md_uuid, fs_uuid, md_device, fs_device):
    """The decided result: the commands, the identities and where the filesystem mounts."""
    name, uses_md = spec["md_name"], result["uses_md"]
    result["wipe"] = [m["id"] for m in result["wipe"]]
    for m in members:
        m["contents"] = drive_rules.describe_contents(m)
    result["commands"] = commands
    result["md_uuid"] = md_uuid
    result["md_device"] = md_device
    result["fs_uuid"] = fs_uuid
    result["fs_device"] = fs_device
    options = ["noatime", "nofail"]
    if result["filesystem"] == "btrfs" and len(members) > 1:
        # Tells the kernel every member at mount time: no btrfs device scan needed (udev, or a
        # container without /dev/btrfs-control).
        options += ["device=" + m["cmd_path"] for m in members]
    result["mount"] = {
        "src": f"UUID={fs_uuid}",
        "path": spec["mountpoint"],
        "fstype": result["filesystem"],
        "opts": ",".join(options),
    }
    result["fstab_line"] = "UUID={} {} {} {} 0 0".format(fs_uuid, spec["mountpoint"], result["filesystem"], result["mount"]["opts"])
    result["mdadm_array_line"] = "ARRAY {} metadata=1.2 UUID={}".format(f"/dev/md/{name}", md_uuid) if uses_md else None
    result["needs_md_driver"] = uses_md and any(c["argv"][0] == "mdadm" for c in commands)
    result["refusals"] = []
    return result


# --------------------------------------------------------------------------
# gathering on the target
# --------------------------------------------------------------------------


def parse_fstab(text):
    """/etc/fstab -> [{"src", "path", "fstype", "opts"}] (comments and blank lines skipped)."""
    entries = []
    for line in (text or "").splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#") or len(fields) < 2:
            continue
        entries.append({
            "src": fields[0],
            "path": common.unescape_octal(fields[1]).rstrip("/") or "/",
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
        "chunk_kb": int(params.get("chunk_kb") or constants.MD_CHUNK_KB),
        "mountpoint": (params.get("mountpoint") or "/data").rstrip("/") or "/",
        "hostname": params.get("hostname") or socket.gethostname().split(".")[0],
        "udev": os.path.exists(common.path_in(root, "/run/udev/control")),
    }
    allow_unstable = bool(params.get("allow_unstable_names"))
    disks = drives.list_disks(root)
    # By name, not ranked as the facts list them: a serial:/wwn: id's command path (fstab device=,
    # the udev rule, mdadm --create) is the alphabetically first link on hosts built so far.
    links = {kname: sorted(names) for kname, names in drives.by_id_links(root).items()}
    try:
        with open(common.path_in(root, "/proc/self/mountinfo")) as handle:
            mounts = common.parse_mountinfo(handle.read())
    except OSError:
        mounts = []
    try:
        with open(common.path_in(root, "/proc/swaps")) as handle:
            swaps = drives.parse_swaps(handle.read())
    except OSError:
        swaps = []

    problems, members, seen, absent = [], [], {}, []  # type: list[str], list[dict], dict[str, str], list[str]
    for spec_id in params.get("devices") or []:
        kname, error = drives.resolve(spec_id, root, allow_unstable, disks, links)
        if error:
            problems.append("storage: " + error)
            if drives.is_absent(error):
                absent.append(str(spec_id))
            continue
        if kname in seen:
            problems.append(f"storage: {seen[kname]} and {spec_id} are the same device ({kname})")
            continue
        seen[kname] = spec_id
        device = drives.inspect_device(kname, root, mounts, swaps, probe=probe)
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
        kname, error = drives.resolve(spec_id, root, True, disks, links)
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
                source = common.path_in(root, mount["source"]) if root != "/" else mount["source"]
                sb = superblocks.parse_btrfs_super(superblocks.read_at(source, superblocks.BTRFS_SUPER_OFFSET, 4096))
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
                    m["btrfs_profiles"] = superblocks.btrfs_profiles(by_fsid[m["btrfs"]["fsid"]], m["btrfs"])
                except (OSError, struct.error):
                    m["btrfs_profiles"] = None

    arrays = drives.md_arrays(root)
    # Mounts and filesystem of a running md array count for its members.
    for m in members:
        for holder in m.get("holders") or []:
            array = arrays.get(holder)
            if array:
                m["mountpoints"] += [x["mountpoint"] for x in mounts if x["majmin"] == array["majmin"]]

    state = drives.mountpoint_state(spec["mountpoint"], mounts, root)
    # The role's own array running degraded: drives not on the host are its lost members (the
    # decision says so as a warning), not a refusal.
    named = drives.named_array(root, spec["md_name"], arrays) if spec["backend"] == "mdadm" else None
    missing = []
    if named and len(problems) == len(absent) and drive_arrays.degraded_context(spec, len(params.get("devices") or []), arrays, named):
        missing, problems = absent, []
        if probe:
            try:
                xfs = superblocks.parse_xfs_super(superblocks.read_at("/dev/" + named, 0, 4096))
            except OSError:
                xfs = None
            arrays[named]["filesystem"] = {"kind": "xfs", "uuid": xfs["uuid"]} if xfs else None
    if problems:
        result = decide(spec, [], arrays, state, drives.md_driver(root))
        result["refusals"] = problems
        result["missing"] = []
        result["members"] = members
        result["warnings"] += warnings
        return result

    # An md array over the members: what filesystem does it hold (read from the array, or for one
    # not running yet from the first member's data area)?
    if spec["backend"] == "mdadm" and spec["level"] != "single" and probe:
        ok, info = drive_arrays.match_md(members, spec, arrays)
        if ok:
            fs = None
            try:
                if info["running"]:
                    buf = superblocks.read_at("/dev/" + info["running"], 0, 4096)
                elif info["first_member"]:
                    buf = superblocks.read_at(info["first_member"], info["data_offset"], 4096)
                else:
                    buf = b""
                xfs = superblocks.parse_xfs_super(buf)
                if xfs:
                    fs = {"kind": "xfs", "uuid": xfs["uuid"]}
                elif info["running"]:
                    sigs, _ = drives.signatures_of("/dev/" + info["running"])
                    if sigs:
                        fs = {"kind": sigs[0]["type"] or "unknown", "uuid": sigs[0].get("uuid")}
            except OSError:
                pass
            for m in members:
                if m.get("md"):
                    m["md"]["filesystem"] = fs
    result = decide(spec, members, arrays, state, drives.md_driver(root), missing=missing, named=named)
    result["warnings"] += warnings
    result["missing"] = missing
    # Filesystems on drives about to be wiped (storage_wipe_devices): an fstab line of theirs at
    # the mount point is the old layout the new one replaces, not a foreign mount.
    wiped = set(result["wipe"]) if result["action"] != "refuse" else set()
    result["replaced_filesystems"] = drives.replaced_filesystems([m for m in members if m["id"] in wiped] if probe else [])
    result["udev_rules_dir_existed"] = os.path.isdir(common.path_in(root, "/etc/udev/rules.d"))
    result["mdadm_conf_other_lines"] = []
    if result.get("md_uuid"):
        try:
            with open(common.path_in(root, "/etc/mdadm/mdadm.conf")) as handle:
                result["mdadm_conf_other_lines"] = mdadm_conf_other_lines(handle.read(), result["md_uuid"])
        except OSError:
            pass
    # What undo restores: the members' live read-ahead and scheduler as found.
    result["live"] = dict(
        (m["cmd_path"], {"kname": m["kname"], "read_ahead_kb": m["read_ahead_kb"], "scheduler": m["scheduler"]})
        for m in members
    )
    try:
        with open(common.path_in(root, "/etc/fstab")) as handle:
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
            level=dict(type="str", required=True, choices=list(constants.STORAGE_LEVELS)),
            backend=dict(type="str", required=True, choices=list(constants.STORAGE_BACKENDS)),
            md_name=dict(type="str", default="data"),
            chunk_kb=dict(type="int", default=constants.MD_CHUNK_KB),
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
