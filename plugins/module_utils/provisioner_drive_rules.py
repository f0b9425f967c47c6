"""What stands between a drive and a new data array: one rule set for the plan (the facts of
provisioner_facts, judged on the control node) and the storage module (the drives it inspects on
the target before any change).

Executed, never imported as a package, like provisioner_constants: the modules carry it to the
targets as ``ansible.module_utils.provisioner_drive_rules``, the plan loads it by path
(provisioner.module_utils.load). So: standard library only, and no import at all.

A drive is a mapping with any of these keys, as either reader has them:
  root_disk, mounted, mountpoints, holders, partitions, signatures (names, as the facts carry
  them, or {"type", "label", "uuid", "offset"}, as the storage module does), signature_probe
  ("failed": blkid could not probe it), probe_error (the module's reason), read_only, removable,
  size_bytes, and the module's raw superblocks btrfs, md, xfs.

``findings`` lists what it finds in one order; each reader has its own words and its own policy
for them (the plan: any finding leaves the drive out; the module: mounted, held and contents are
the array it adopts, or wiped when storage_wipe_devices allows it, the rest refuse).
"""

# /dev/disk/by-id link prefixes, best first: hardware ids (WWN, NVMe EUI) before model_serial names.
BY_ID_RANK = (("wwn-", 0), ("nvme-eui.", 1), ("nvme-nvme.", 2), ("nvme-", 3), ("ata-", 3), ("scsi-", 4))


def sort_by_id(links):
    """/dev/disk/by-id links, best first (BY_ID_RANK, then the shorter, then by name), once each."""

    def rank(link):
        name = link.rsplit("/", 1)[-1]
        for prefix, value in BY_ID_RANK:
            if name.startswith(prefix):
                return (value, len(name), name)
        return (9, len(name), name)

    return sorted(set(links), key=rank)


def norm_wwn(text):
    """A WWN as the user may write it (wwn-0x..., naa., eui., any case) -> bare lower-case digits."""
    text = (text or "").strip().lower()
    for prefix in ("wwn-", "0x", "naa.", "eui.", "t10.", "nvme."):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return "".join(c for c in text if "0" <= c <= "9" or "a" <= c <= "z")


def norm_serial(text):
    """A drive serial as compared: without surrounding blanks."""
    return (text or "").strip()


# The kinds of finding, in the order both readers report them.
KINDS = ("root", "mounted", "held", "partitions", "signatures", "unprobed", "read_only", "removable", "empty")

# The findings that are what a drive holds (wiped with consent), as opposed to its use or state.
CONTENTS = ("partitions", "signatures")


def signature_types(device):
    """The names of the signatures on a drive (the facts' strings or the module's dicts), once each."""
    found: list = []
    for sig in device.get("signatures") or []:
        kind = (sig.get("type") if isinstance(sig, dict) else sig) or "unknown"
        if kind not in found:
            found.append(kind)
    return found


def _raw_types(device):
    """The superblocks only the module's raw reads saw (no signature listed for them)."""
    return [kind for kind in ("btrfs", "md", "xfs") if device.get(kind)]


def findings(device):
    """[(kind, detail)] for one drive, in KINDS order; empty for a drive free for a new array.

    Details: root, mounted -> the mountpoints; held -> the holders; partitions -> their names;
    signatures -> the signature names (else the raw superblocks'); unprobed -> the reason or None;
    read_only, removable, empty -> None."""
    points = list(device.get("mountpoints") or [])
    found: list = []
    if device.get("root_disk"):
        found.append(("root", points))
    if points or device.get("mounted"):
        found.append(("mounted", points))
    if device.get("holders"):
        found.append(("held", list(device["holders"])))
    if device.get("partitions"):
        found.append(("partitions", list(device["partitions"])))
    sigs = signature_types(device) or _raw_types(device)
    if sigs:
        found.append(("signatures", sigs))
    if device.get("probe_error") or device.get("signature_probe") == "failed":
        found.append(("unprobed", device.get("probe_error")))
    if device.get("read_only"):
        found.append(("read_only", None))
    if device.get("removable"):
        found.append(("removable", None))
    if not device.get("size_bytes"):
        found.append(("empty", None))
    return found


def kinds_of(device):
    """The kinds of finding on one drive, as a set."""
    return {kind for kind, _detail in findings(device)}


def has_contents(device):
    """True when the drive holds something (partitions, a signature, a superblock) a new array would destroy."""
    return bool(kinds_of(device) & set(CONTENTS))


def sig_text(sig):
    """One signature in words, for a refusal: 'an ext4 filesystem (label L, UUID U)'."""
    kind = sig.get("type") or "unknown"
    extra = []
    if sig.get("label"):
        extra.append("label {}".format(sig["label"]))
    if sig.get("uuid"):
        extra.append("UUID {}".format(sig["uuid"]))
    what = {
        "linux_raid_member": "an md RAID member signature",
        "gpt": "a GPT partition table",
        "PMBR": "a protective MBR",
        "dos": "a DOS partition table",
        "LVM2_member": "an LVM physical volume",
        "crypto_LUKS": "a LUKS encrypted volume",
        "swap": "a swap signature",
    }.get(kind)
    if what is None:
        article = "an" if kind[:1].lower() in "aeioufnx" else "a"
        what = f"{article} {kind} filesystem" if kind not in ("ambiguous", "unknown") else f"signatures ({kind})"
    return what + (" ({})".format(", ".join(extra)) if extra else "")


def describe_contents(device):
    """What the drive holds, in words (for the module's refusal and its result)."""
    parts = []
    if device.get("partitions"):
        parts.append("{:d} partition(s) ({})".format(len(device["partitions"]), ", ".join(device["partitions"])))
    seen = set()
    for sig in device.get("signatures") or []:
        text = sig_text(sig if isinstance(sig, dict) else {"type": sig})
        if text not in seen:
            seen.add(text)
            parts.append(text)
    if not parts and device.get("btrfs"):
        parts.append("a btrfs filesystem (UUID {})".format(device["btrfs"]["fsid"]))
    if not parts and device.get("md"):
        parts.append("an md RAID member signature (array {})".format(device["md"]["uuid"]))
    if not parts and device.get("xfs"):
        parts.append("an xfs filesystem (UUID {})".format(device["xfs"]["uuid"]))
    return " and ".join(parts)
