"""What the storage role promises, checked on the target.

Nothing is configured unless storage_devices names drives (or storage_use_plan_proposal confirms
the plan's proposal): then the checks assert that nothing of the role exists. Where the md backend
needs a kernel without an md driver (/proc/mdstat absent), the array cannot exist: the checks of the
mount, fstab and udev rule are skipped with that reason and the pending plan file is checked instead.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest

from provisioner.checks import applied_plan, as_root, role_constants, role_vars

UDEV_RULE, MDADM_CONF = role_constants("storage", "udev_rule", "mdadm_conf")
FILESYSTEM = {"btrfs": "btrfs", "mdadm": "xfs"}
NO_MD = "no md driver in this kernel (/proc/mdstat absent): the md array cannot be created here"


@pytest.fixture()
def storage(host):
    values = role_vars(host, "storage")
    devices = values.get("storage_devices") or []
    if isinstance(devices, str):
        devices = [devices]
    if not devices and values.get("storage_use_plan_proposal") in (True, "true", "True"):
        devices = [d["id"] for d in (applied_plan(host).get("storage") or {}).get("devices") or []]
    values["storage_devices"] = list(devices)
    values["storage_mountpoint"] = str(values.get("storage_mountpoint") or "/data").rstrip("/") or "/"
    values["storage_read_ahead_kb"] = int(values.get("storage_read_ahead_kb") or 4096)
    values["storage_backend"] = str(values.get("storage_backend") or "mdadm")
    values["storage_level"] = str(values.get("storage_level") or "raid0")
    state_dir = role_vars(host, "common").get("common_state_dir") or "/var/lib/provisioner"
    values["originals"] = f"{state_dir}/originals/storage.json"
    values["plan_file"] = f"{state_dir}/storage-plan.txt"
    values["uses_md"] = values["storage_backend"] == "mdadm" and values["storage_level"] != "single"
    return values


@pytest.fixture()
def configured(storage):
    if not storage["storage_devices"]:
        pytest.skip("storage_devices is empty and storage_use_plan_proposal is false: nothing configured")
    if storage.get("storage_apply") in (False, "false", "False"):
        pytest.skip("storage_apply is false: the role only plans")
    return storage


@pytest.fixture()
def built(host, configured):
    if configured["uses_md"] and not host.file("/proc/mdstat").exists:
        pytest.skip(NO_MD)
    return configured


def _fstab_entry(host, path):
    f = host.file("/etc/fstab")
    for line in f.content_string.splitlines() if f.exists else []:
        fields = line.split()
        if len(fields) >= 4 and not fields[0].startswith("#") and fields[1].rstrip("/") == path:
            return fields
    return None


def _member_paths(host, storage):
    """Kernel paths of the members named by path (serial:/wwn: forms are not resolved here)."""
    out = []
    for spec in storage["storage_devices"]:
        if spec.startswith("/dev/"):
            out.append(host.check_output(f"readlink -f {shlex.quote(spec)}"))
    return out


def test_nothing_created_without_devices(host, storage):
    if storage["storage_devices"]:
        pytest.skip(f"storage_devices names {len(storage['storage_devices'])} drive(s)")
    with as_root(host):
        present = [f for f in (UDEV_RULE, storage["originals"], storage["plan_file"]) if host.file(f).exists]
    assert present == [], f"storage_devices is empty but the role's files exist: {present}"


def test_mounted_with_noatime(host, built):
    mount = host.mount_point(built["storage_mountpoint"])
    assert mount.exists, f"{built['storage_mountpoint']} is not mounted"
    assert mount.filesystem == FILESYSTEM[built["storage_backend"]]
    assert "noatime" in mount.options, f"mounted with {mount.options}"


def test_fstab_by_uuid_with_nofail(host, built):
    path = built["storage_mountpoint"]
    entry = _fstab_entry(host, path)
    assert entry is not None, f"no /etc/fstab entry for {path}"
    assert entry[0].startswith("UUID="), f"fstab names the array by {entry[0]}, not by UUID"
    assert entry[2] == FILESYSTEM[built["storage_backend"]]
    opts = entry[3].split(",")
    assert "noatime" in opts and "nofail" in opts, f"fstab options {entry[3]}"
    with as_root(host):
        source = host.check_output(f"findmnt --noheadings --output SOURCE --mountpoint {shlex.quote(path)}")
        source = source.split("[")[0]  # btrfs subvolume suffix
        uuid = host.check_output(f"blkid -p -s UUID -o value {shlex.quote(source)}")
    assert entry[0] == f"UUID={uuid}", f"fstab has {entry[0]}, the mounted filesystem is UUID={uuid}"


def test_btrfs_mount_names_every_member(host, built):
    if built["storage_backend"] != "btrfs" or len(built["storage_devices"]) < 2:
        pytest.skip("only btrfs over several drives needs device= options")
    entry = _fstab_entry(host, built["storage_mountpoint"])
    assert entry is not None
    devices = [o.split("=", 1)[1] for o in entry[3].split(",") if o.startswith("device=")]
    assert len(devices) == len(built["storage_devices"]), f"fstab options {entry[3]}"


def test_mount_point_owned_by_the_ml_group(host, built):
    root = host.file(built["storage_mountpoint"])
    assert root.is_directory
    assert root.group == built["storage_owner_group"]
    assert root.mode == int(str(built.get("storage_mount_mode") or "2775"), 8)


def test_udev_rule_persists_scheduler_and_read_ahead(host, built):
    f = host.file(UDEV_RULE)
    assert f.exists, f"{UDEV_RULE} missing"
    assert f.user == "root" and f.mode == 0o644
    rules = [ln for ln in f.content_string.splitlines() if ln.strip() and not ln.startswith("#")]
    ra = f'ATTR{{queue/read_ahead_kb}}="{built["storage_read_ahead_kb"]}"'
    assert any(ra in ln for ln in rules), f"no read_ahead_kb rule in {UDEV_RULE}"
    if built["uses_md"]:
        assert any("ENV{MD_UUID}==" in ln and ra in ln for ln in rules), "read-ahead is not set on the array"
    else:
        assert sum(ra in ln for ln in rules) == len(built["storage_devices"]), "read-ahead is not set on every member"
    for path in _member_paths(host, built):
        name = path.rsplit("/", 1)[-1]
        if name.startswith("nvme"):
            assert any('ATTR{queue/scheduler}="none"' in ln for ln in rules), f"no scheduler rule for {path}"


def test_read_ahead_live(host, built):
    want = built["storage_read_ahead_kb"] * 2  # 512-byte sectors
    with as_root(host):
        if built["uses_md"]:
            source = host.check_output(f"findmnt --noheadings --output SOURCE --mountpoint {built['storage_mountpoint']}")
            targets = [source]
        else:
            targets = _member_paths(host, built)
        for target in targets:
            assert int(host.check_output(f"blockdev --getra {shlex.quote(target)}")) == want, f"read-ahead of {target}"


def test_mdadm_conf_names_the_array(host, built):
    if not built["uses_md"]:
        pytest.skip("no md array with this backend and level")
    f = host.file(MDADM_CONF)
    assert f.exists
    rule = host.file(UDEV_RULE).content_string
    md_uuid = rule.split('ENV{MD_UUID}=="', 1)[1].split('"', 1)[0]
    hexed = md_uuid.replace(":", "").lower()
    lines = [
        ln
        for ln in f.content_string.splitlines()
        if ln.startswith("ARRAY ")
        and "UUID=" in ln
        and ln.split("UUID=", 1)[1].split()[0].replace(":", "").replace("-", "").lower() == hexed
    ]
    assert len(lines) == 1, f"{MDADM_CONF} should have exactly one ARRAY line for the array {md_uuid}: {lines}"


def test_no_pending_plan_once_built(host, built):
    with as_root(host):
        assert not host.file(built["plan_file"]).exists, f"{built['plan_file']} left although the array exists"


def test_pending_plan_where_md_is_missing(host, configured):
    if not configured["uses_md"] or host.file("/proc/mdstat").exists:
        pytest.skip("the md driver is present (or not needed): nothing is pending")
    with as_root(host):
        f = host.file(configured["plan_file"])
        assert f.exists, f"{configured['plan_file']} missing: where is the planned array?"
        text = f.content_string
    name = configured.get("storage_md_name") or "data"
    assert "no md driver" in text
    assert f"mdadm --create /dev/md/{name} " in text
    assert f"ARRAY /dev/md/{name} metadata=1.2 UUID=" in text
    assert "mkfs.xfs " in text
    assert not host.mount_point(configured["storage_mountpoint"]).exists


def test_originals_recorded_for_undo(host, configured):
    with as_root(host):
        f = host.file(configured["originals"])
        assert f.exists, f"{configured['originals']} missing: undo would not know what to restore"
        data = json.loads(f.content_string)
    assert data["mountpoint"].rstrip("/") == configured["storage_mountpoint"]
    assert UDEV_RULE in data["created"]


def _mdstat_entry(text, kname):
    """The lines of /proc/mdstat about array KNAME (md127): its member line and the status lines after it."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith(f"{kname} :"):
            inside = True
        elif inside and not line.strip():
            break
        if inside:
            lines.append(line)
    return lines


def test_md_array_runs_with_every_drive(host, built):
    """A degraded array fails, naming how many drives run, which of storage_devices are not on the host,
    and the fix; an array rebuilding a member (recovery) passes: it heals itself."""
    if not built["uses_md"]:
        pytest.skip("no md array with this backend and level")
    device = f"/dev/md/{built.get('storage_md_name') or 'data'}"
    with as_root(host):
        kname = host.check_output(f"readlink -f {shlex.quote(device)}").rsplit("/", 1)[-1]
        entry = _mdstat_entry(host.file("/proc/mdstat").content_string, kname)
        assert entry, f"{device} ({kname}) is not in /proc/mdstat: the array is not assembled (run provisioner up)"
        absent = [d for d in built["storage_devices"] if d.startswith("/dev/") and not host.file(d).exists]
    text = " ".join(entry)
    slots = re.search(r"\[(\d+)/(\d+)\]\s*\[([U_]+)\]", text)
    failed = re.findall(r"(\S+)\[\d+\]\(F\)", text)
    if slots is None:
        return  # raid0 shows no slots: it cannot run degraded
    want, have = int(slots.group(1)), int(slots.group(2))
    if have >= want and not failed:
        return
    if "recovery =" in text and not failed:
        return  # rebuilding the lost member now
    missing = ", ".join(absent + failed) or "a member"
    pytest.fail(
        f"the data array {device} ({kname}) runs degraded on {have} of {want} drives, missing: {missing} - put the "
        "drive back or list a blank drive in its place in storage_devices, then run provisioner up (it re-adds or "
        "adds it and the array rebuilds)"
    )
