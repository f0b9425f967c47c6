"""What the hugepages role promises, checked on the target.

With a count of 0 the role changes nothing, so the checks assert that nothing of it exists.
Live kernel values (vm.nr_hugepages, /proc/cmdline) are not asserted here: in a container they
belong to the host, and 1 GiB pages need a reboot; tests/host/ checks them where they are real.
"""

from __future__ import annotations

import json

import pytest

from provisioner.checks import as_root, role_constants, role_vars
from provisioner.constants import HUGEPAGE_KIB

SYSCTL_FILE, GRUB_FILE, LIMITS_FILE, PAGESIZE_SHOWN = role_constants(
    "hugepages", "sysctl_file", "grub_file", "limits_file", "pagesize_shown"
)
PAGE_KIB = HUGEPAGE_KIB


@pytest.fixture()
def hugepages(host):
    values = role_vars(host, "hugepages")
    values["hugepages_count"] = int(values["hugepages_count"] or 0)
    values["hugepages_size"] = str(values["hugepages_size"])
    values["originals"] = f"{role_vars(host, 'common')['common_state_dir']}/originals/hugepages.json"
    return values


@pytest.fixture()
def configured(hugepages):
    if hugepages["hugepages_count"] == 0:
        pytest.skip("hugepages_count is 0: nothing configured")
    return hugepages


def _fstab_entry(host, path):
    for line in host.file("/etc/fstab").content_string.splitlines() if host.file("/etc/fstab").exists else []:
        fields = line.split()
        if len(fields) >= 4 and not fields[0].startswith("#") and fields[1] == path:
            return fields
    return None


def _gid(host, group):
    return int(host.check_output(f"getent group {group}").split(":")[2])


def test_nothing_created_without_a_count(host, hugepages):
    if hugepages["hugepages_count"] != 0:
        pytest.skip(f"hugepages_count is {hugepages['hugepages_count']}")
    with as_root(host):
        present = [f for f in (SYSCTL_FILE, GRUB_FILE, LIMITS_FILE, hugepages["originals"]) if host.file(f).exists]
        assert present == [], f"hugepages_count is 0 but the role's files exist: {present}"
        assert _fstab_entry(host, hugepages["hugepages_mount_path"]) is None
        assert not host.mount_point(hugepages["hugepages_mount_path"]).exists


def test_reservation_persisted(host, configured):
    count, size = configured["hugepages_count"], configured["hugepages_size"]
    if size == "2M":
        f = host.file(SYSCTL_FILE)
        assert f.exists, f"{SYSCTL_FILE} missing"
        assert f.user == "root" and f.mode == 0o644
        assert f"vm.nr_hugepages = {count}" in f.content_string.splitlines()
        assert not host.file(GRUB_FILE).exists, f"{GRUB_FILE} left from a 1G run"
    else:
        f = host.file(GRUB_FILE)
        assert f.exists, f"{GRUB_FILE} missing"
        assert f'hugepagesz=1G hugepages={count}"' in f.content_string
        assert "GRUB_CMDLINE_LINUX_DEFAULT=" in f.content_string
        assert not host.file(SYSCTL_FILE).exists, f"{SYSCTL_FILE} left from a 2M run"


def test_hugetlbfs_in_fstab(host, configured):
    path = configured["hugepages_mount_path"]
    entry = _fstab_entry(host, path)
    assert entry is not None, f"no /etc/fstab entry for {path}"
    assert entry[2] == "hugetlbfs"
    opts = entry[3].split(",")
    assert f"pagesize={configured['hugepages_size']}" in opts
    assert f"gid={_gid(host, configured['hugepages_group'])}" in opts
    assert f"mode={configured['hugepages_mount_mode']}" in opts


def test_hugetlbfs_mounted_for_the_ml_group(host, configured):
    path = configured["hugepages_mount_path"]
    mount = host.mount_point(path)
    assert mount.exists, f"{path} is not mounted"
    assert mount.filesystem == "hugetlbfs"
    shown = set(PAGESIZE_SHOWN[configured["hugepages_size"]])
    assert shown & set(mount.options), f"{path} is mounted with {mount.options}, not {configured['hugepages_size']} pages"
    root = host.file(path)
    assert root.group == configured["hugepages_group"]
    assert root.mode == int(str(configured["hugepages_mount_mode"]), 8)


def test_memlock_matches_the_reservation(host, configured):
    f = host.file(LIMITS_FILE)
    if not configured["hugepages_memlock"]:
        assert not f.exists
        return
    kib = max(configured["hugepages_count"] * PAGE_KIB[configured["hugepages_size"]], 8192)  # never below Debian's default
    group = configured["hugepages_group"]
    lines = [ln.split() for ln in f.content_string.splitlines() if ln.strip() and not ln.startswith("#")]
    assert sorted(lines) == sorted([[f"@{group}", "hard", "memlock", str(kib)], [f"@{group}", "soft", "memlock", str(kib)]])
    assert f.user == "root" and f.mode == 0o644


def test_originals_recorded_for_undo(host, configured):
    with as_root(host):
        f = host.file(configured["originals"])
        assert f.exists, f"{configured['originals']} missing: undo would not know what to restore"
        data = json.loads(f.content_string)
    assert isinstance(data["nr_hugepages"], int)
    assert isinstance(data["cmdline_hugepage_args"], list)
    expected = SYSCTL_FILE if configured["hugepages_size"] == "2M" else GRUB_FILE
    assert expected in data["created"]
