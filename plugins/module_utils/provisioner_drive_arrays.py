# Copyright: provisioner contributors
# Apache License 2.0 (see pyproject.toml)
"""Which array or filesystem the storage module's drives already carry, and whether it is the one
asked for: match_btrfs, match_md and, for the role's own md array running degraded,
degraded_context and match_degraded; planned_uuid, the UUIDs of what it would create. Pure: the
drives as inspected (provisioner_drives.inspect_device) in, a verdict out.

Standard library only (python3 3.8 and later).
"""

import json
import uuid

# A sibling in the same module_utils package, by either name Ansible gives it (ansible.module_utils from the
# checkout, ansible_collections.provisioner.ml.plugins.module_utils installed). Absolute names only: Mitogen's module finder does not follow relative imports.
try:  # installed as the provisioner.ml collection
    from ansible_collections.provisioner.ml.plugins.module_utils.provisioner_drive_rules import (
        describe_contents,
        has_contents,
    )
except ImportError:  # run from the repository: ansible.cfg and the CLI put plugins/module_utils on the path
    from ansible.module_utils.provisioner_drive_rules import describe_contents, has_contents

UUID_NAMESPACE = uuid.UUID("6f1d3b52-57c1-4c8e-9a53-7a4f0c2d8e11")
WIPE_HINT = "add it to storage_wipe_devices to allow wiping it"


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


def member_text(member):
    return member["id"] if member["id"] == member["path"] else "{} ({})".format(member["id"], member["path"])


def profile_for(level, count):
    data = level
    metadata = "raid1" if count > 1 else "dup"
    return data, metadata


def _one_on_all(members, kind, ident, what):
    """The members' superblocks of KIND ("btrfs", "md") and None when all of them carry the same one
    (by its IDENT); else None and the verdict: (None, None) when none does, (False, why) when only
    some of them do or they carry several (WHAT names one: "btrfs filesystem", "md array")."""
    sbs = [m.get(kind) for m in members]
    if not any(sbs):
        return None, (None, None)
    ids = sorted({sb[ident] for sb in sbs if sb})
    if len(ids) != 1 or not all(sbs):
        which = f"that {what} covers" if len(ids) == 1 else "the {}s {} cover".format(what, ", ".join(ids))
        return None, (False, which + " only some of the listed drives")
    return sbs, None


def match_btrfs(members, spec):
    """(True, fs) when the members carry exactly one btrfs filesystem spanning exactly them with the
    requested profiles; (False, why) when they carry one that differs; (None, None) when none."""
    sbs, verdict = _one_on_all(members, "btrfs", "fsid", "btrfs filesystem")
    if verdict:
        return verdict
    sb = sbs[0]
    devids = sorted(s["devid"] for s in sbs)
    if sb["num_devices"] != len(members) or len(set(devids)) != len(devids):
        return False, "that btrfs filesystem spans {:d} device(s), {:d} of them listed".format(
            sb["num_devices"], len(members))
    profiles = members[0].get("btrfs_profiles")
    data, metadata = profile_for(spec["level"], len(members))
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
    sbs, verdict = _one_on_all(members, "md", "uuid", "md array")
    if verdict:
        return verdict
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
        who = member_text(m)
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
