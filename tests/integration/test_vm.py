"""The storage, hugepages and cpu_tuning roles on a real kernel: one lab VM (qemu, Debian 12's
own kernel, grub on its disk) with four virtual NVMe drives, booted once for the module (marked
lab), telling one story through `provisioner up`, `verify`, `status` and `undo` themselves.

What a container cannot show:
- mdadm RAID10 (near=2) + XFS on the four drives: the array built with the planned chunk, XFS's
  stripe unit and width matching chunk and data drives (xfs_info), mounted by UUID with nofail,
  the array named in mdadm.conf and that mdadm.conf inside the initramfs;
- the host tuning live, not only persisted: THP enabled and defrag, swappiness, NUMA balancing
  and tuned's profile written into the running kernel (a container sees them read-only);
- a second run changes nothing, and with `--reboot` reboots the VM exactly once for the 1 GiB
  hugepages on the kernel command line (through grub: the VM boots from its disk), although
  the inventory names it as a user names a forwarded host (127.0.0.1 and a port, no
  ansible_connection);
- after the reboot the array assembles under its name from the initramfs, the filesystem is
  mounted again with a file's checksum intact, the 1 GiB page is reserved, a standalone
  `provisioner verify` without the runs' -e options passes (it judges by the options up
  recorded on the host) with every live cpu_tuning check run (only the governor's skipped: no
  cpufreq driver here), the first run after the reboot changes nothing (the applied plan stays
  as it was), and the smoke test's configuration checks (`smoke --config-only`: the plan's
  threads in a login shell and a service, THP, the data mount) pass;
- the RAID10 loses a drive (pulled from the running VM through qemu's control socket), and
  `undo --reboot` of hugepages and cpu_tuning reboots the VM without it: the one boot shows both.
  Undo takes the 1 GiB pages off the kernel command line and reboots once, after which no
  1 GiB page is reserved and the VM runs its own tuning again (undo covers only the two roles
  whose restore only a real kernel proves, grub's line and a boot, the live values: storage's
  undo keeps the array, and the full undo of every role is proven in a container by
  test_up.py). The VM comes up (nofail, md's degraded start), the array runs on three drives
  with the file's checksum intact; `up --tags storage` keeps the array as it is, changes
  nothing and warns, its verify fails naming the degraded array (so up exits 1, as verify
  does), and status shows it drifted, naming the lost drive;
- the drive comes back: up re-adds it (its superblock names the array), the array rebuilds to
  clean, verify passes, status is ok, and a re-run changes nothing.

Left out on purpose, each proven elsewhere at a fraction of a VM's minutes: RAID1 as a level on
a real kernel (the layout is unit-tested in tests/unit/test_storage_module.py), and replacing a
stopped array by one of another level on drives that may be wiped (the wipe decision is
unit-tested there too; a real wipe is test_storage.py's).

Software emulation (KVM does not run guests on every host, see provisioner/lab/vm.py) makes
every task slow, so the runs use Mitogen (PROVISIONER_STRATEGY=mitogen) and only the three
roles' tags (the first run also common's configure phase and thread_env, for the configuration
checks); one array is built and the VM reboots twice in all (a reboot under emulation is about
a minute of a core). The drives are small (XFS's 300 MB at least on the array) so the syncs are
short. Times of the image build, the boot, each
run, the reboots and the rebuild are printed (pytest -s).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable

import pytest
from vm_lab import assert_data_array, booted, cli_json, ssh, user_inventory

from provisioner import lab
from provisioner.errors import ExitCode
from provisioner.lab import vm

pytestmark = pytest.mark.lab

NAME = "vm-test"
CHUNK_KB = 512
# As small as XFS allows on the RAID10 (300 MB, the array holds two drives' worth): short syncs.
DRIVE_SIZE = "512M"
LOST = 1  # the drive pulled out of the RAID10 (serial DATA1)
TAGS = ("--tags", "storage,hugepages,cpu_tuning")
# The first run also writes what the smoke test's configuration checks read after the reboot:
# role common's ML user and recorded plan (its configure phase: the base packages are not what a
# real kernel proves) and role thread_env's thread settings (a login shell, systemd's manager).
FIRST_TAGS = ("--tags", "storage,hugepages,cpu_tuning,common_configure,thread_env")
# Undo gives back only what a real kernel proves given back (grub's line and a boot, the live
# values); storage's undo keeps the array, and every role's undo is test_up.py's, in a container
# (under emulation each task costs a second).
UNDO_TAGS = ("--tags", "hugepages,cpu_tuning")
# One NUMA node: the plan leaves kernel.numa_balancing alone, so the run is told a value (the
# kernel's own on one node is 0) to show that it is written live.
NUMA_BALANCING = 1
THP = "/sys/kernel/mm/transparent_hugepage"
LIVE = {
    "swappiness": "/proc/sys/vm/swappiness",
    "numa_balancing": "/proc/sys/kernel/numa_balancing",
    "thp_enabled": f"{THP}/enabled",
    "thp_defrag": f"{THP}/defrag",
}
HUGEPAGES_1G = "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"
TIMES: dict[str, float] = {}


def _vars(server: lab.LabServer) -> list[str]:
    devices = ",".join(server.drives)
    return [
        "-e",
        f"storage_devices=[{devices}]",
        "-e",
        "storage_backend=mdadm",
        "-e",
        "storage_level=raid10",
        "-e",
        f"storage_chunk_kb={CHUNK_KB}",
        "-e",
        "hugepages_size=1G",
        "-e",
        "hugepages_count=1",
        "-e",
        f"cpu_tuning_numa_balancing={NUMA_BALANCING}",
    ]


def live_tuning(server: lab.LabServer) -> dict[str, str]:
    """The running kernel's values of what cpu_tuning sets (THP as its selected mode), and tuned's profile."""
    out = ssh(server, "for f in " + " ".join(LIVE.values()) + "; do cat $f; done; tuned-adm active").splitlines()
    values = dict(zip(LIVE, (re.sub(r".*\[(\w+)\].*", r"\1", line.strip()) for line in out), strict=False))
    values["tuned"] = out[len(LIVE)].removeprefix("Current active profile: ").strip() if len(out) > len(LIVE) else ""
    return values


def with_console(server: lab.LabServer, result: tuple) -> tuple:
    """A run's result, its errors followed by the VM's serial console's last lines where it failed (a
    reboot that never answered: where the boot stopped)."""
    if result[0] == ExitCode.OK:
        return result
    rc, data, errors, *rest = result
    return (rc, data, [*errors, f"console: {vm.console_tail(server.root / 'console.log')}"], *rest)


def boot_id(server: lab.LabServer) -> str:
    return ssh(server, "cat /proc/sys/kernel/random/boot_id").strip()


def wait_for(what: str, probe: Callable[[], str | None], timeout: float = 600, every: float = 3.0) -> str:
    """PROBE's output once it is not None, at most TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = probe()
        if out is not None:
            return out
        time.sleep(every)
    pytest.fail(f"{what}: not within {timeout:.0f} s")


def mdstat(server: lab.LabServer) -> str:
    return ssh(server, "cat /proc/mdstat")


def clean(server: lab.LabServer) -> str | None:
    """/proc/mdstat once the data array runs on every drive with nothing to rebuild or sync."""
    text = mdstat(server)
    return text if re.search(r"\[(\d+)/\1\] \[U+\]", text) and not re.search(r"recovery|resync", text) else None


@pytest.fixture(scope="module")
def vm_server(vm_requirements):
    with booted(NAME, TIMES, "lab VM times", drives=4, drive_size=DRIVE_SIZE) as server:
        yield server


@pytest.fixture(scope="module")
def inventory(vm_server) -> str:
    """The VM as a user's inventory names a forwarded host: 127.0.0.1 and a port, no ansible_connection."""
    return str(user_inventory(vm_server))


def _run_seconds(run: dict) -> tuple[float, int]:
    """A run's seconds and its task results on the one host (ok, changed and skipped)."""
    host = run["hosts"][NAME]
    return run["seconds"], host["ok"] + host["changed"] + host["skipped"]


@pytest.fixture(scope="module")
def stock_tuning(vm_server):
    """The VM's own values before provisioner touched it (Debian's kernel and tuned's virtual-guest),
    once its boot has finished (sshd answers before tuned has started)."""
    ssh(vm_server, "systemctl is-system-running --wait >/dev/null || true")
    return live_tuning(vm_server)


@pytest.fixture(scope="module")
def first_up(vm_server, inventory, stock_tuning):
    rc, data, errors, messages = cli_json("up", "-i", inventory, *FIRST_TAGS, "--no-verify", *_vars(vm_server))
    if data:
        TIMES["first run"], tasks = _run_seconds(data)
        TIMES["first run per task"] = TIMES["first run"] / max(tasks, 1)
    return rc, data, errors, messages


def test_raid10_and_xfs_are_built_on_the_nvme_drives_and_persisted(vm_server, first_up):
    rc, data, errors, messages = first_up
    assert rc == ExitCode.OK, errors
    assert data["hosts"][NAME]["changed"] > 0
    array = assert_data_array(vm_server, "raid10", vm_server.drives, CHUNK_KB, data_drives=2)
    assert "Layout : near=2" in array["detail"], array["detail"]
    assert "nofail" in array["fstab"][3].split(","), array["fstab"]
    # The initramfs carries that mdadm.conf (else the array comes back as /dev/md127 at boot).
    inside = ssh(
        vm_server,
        "rm -rf /tmp/i && unmkinitramfs /boot/initrd.img-$(uname -r) /tmp/i && "
        "find /tmp/i -path '*etc/mdadm/mdadm.conf' -exec grep -h '^ARRAY' {} +",
    )
    assert inside.strip().splitlines() == [array["array"]], inside
    assert any("reboot pending" in m and "hugepages" in m for m in messages), messages


def test_the_host_tuning_is_written_into_the_running_kernel(vm_server, first_up, stock_tuning):
    assert first_up[0] == ExitCode.OK, first_up[2]
    wanted = {
        "swappiness": "10",
        "numa_balancing": str(NUMA_BALANCING),
        "thp_enabled": "madvise",
        "thp_defrag": "madvise",
        "tuned": "provisioner-ml",
    }
    assert live_tuning(vm_server) == wanted
    # Each of them was something else before: the run wrote them, they were not already so.
    changed = {k for k in wanted if stock_tuning[k] != wanted[k]}
    assert changed == set(wanted) - {"thp_defrag"}, stock_tuning  # Debian's THP defrag is madvise already


@pytest.fixture(scope="module")
def rebooted_up(vm_server, inventory, first_up):
    """The second run with --reboot; its verify is the standalone one below (verified)."""
    assert first_up[0] == ExitCode.OK, first_up[2]
    ssh(vm_server, "head -c 8M /dev/urandom > /data/probe && sync")
    before = {
        "sha": ssh(vm_server, "sha256sum /data/probe").split()[0],
        "boot_id": boot_id(vm_server),
        "plan": ssh(vm_server, "cat /etc/provisioner/plan.json"),
        "meminfo": ssh(vm_server, "cat /proc/meminfo"),
    }
    start = time.monotonic()
    result = with_console(vm_server, cli_json("up", "-i", inventory, *TAGS, "--reboot", "--no-verify", *_vars(vm_server)))
    TIMES["second run + reboot"] = time.monotonic() - start
    data = result[1]
    if data:
        TIMES["second run"], tasks = _run_seconds(data)
        TIMES["second run per task"] = TIMES["second run"] / max(tasks, 1)
        if data.get("rebooted"):
            TIMES["reboot run"] = data["rebooted"]["seconds"]
    return result, before


def test_a_second_run_changes_nothing_and_reboots_once(rebooted_up):
    (rc, data, errors, _), _ = rebooted_up
    assert rc == ExitCode.OK, errors
    assert data["hosts"][NAME]["changed"] == 0, data["changes"]
    assert list(data["reboot"]["reboot"]) == [NAME], data["reboot"]
    assert data["rebooted"]["hosts"][NAME]["failed"] == 0


def test_after_the_reboot_the_array_assembles_under_its_name_with_the_data_intact(vm_server, rebooted_up):
    _, before = rebooted_up
    assert boot_id(vm_server) != before["boot_id"]
    assert "hugepagesz=1G" in ssh(vm_server, "cat /proc/cmdline")  # the line grub read from the disk
    kernel_name = ssh(vm_server, "readlink -f /dev/md/data").strip()
    assert re.fullmatch(r"/dev/md\d+", kernel_name), kernel_name
    assert re.search(r"Name : \S*:?data\b", ssh(vm_server, "mdadm --detail /dev/md/data"))
    assert ssh(vm_server, "findmnt -n -o SOURCE,FSTYPE /data").split() == [kernel_name, "xfs"]
    assert ssh(vm_server, "sha256sum /data/probe").split()[0] == before["sha"]
    assert ssh(vm_server, f"cat {HUGEPAGES_1G}").strip() == "1"


@pytest.fixture(scope="module")
def verified(inventory, rebooted_up):
    """A standalone `provisioner verify` of the runs' roles after the reboot, without the runs' -e
    options: it judges by what up recorded on the host (the drives, the level, the 1 GiB page)."""
    assert rebooted_up[0][0] == ExitCode.OK, rebooted_up[0][2]
    start = time.monotonic()
    result = cli_json("verify", "-i", inventory, *TAGS)
    TIMES["verify"] = time.monotonic() - start
    return result


def test_a_standalone_verify_after_the_reboot_passes_without_the_runs_options(verified):
    rc, data, errors, _ = verified
    assert rc == ExitCode.OK, (errors, data and data["roles"])
    roles = data["roles"][NAME]
    assert set(roles) == {"storage", "hugepages", "cpu_tuning"}, roles
    assert roles["storage"]["outcome"] == roles["hugepages"]["outcome"] == roles["cpu_tuning"]["outcome"] == "passed", roles
    # It checked the array the runs' -e options named, not "nothing configured".
    storage = {c["check"]: c["outcome"] for c in data["hosts"][NAME] if c["role"] == "storage"}
    assert storage["test_md_array_runs_with_every_drive"] == "passed", storage
    assert storage["test_nothing_created_without_devices"] == "skipped", storage


def test_after_the_reboot_every_live_cpu_tuning_check_ran_and_passed(verified):
    """The container lab's "read-only here" skips run here; only what this VM lacks is skipped, saying so."""
    rc, data, errors, _ = verified
    assert rc == ExitCode.OK, errors
    checks = {c["check"]: c for c in data["hosts"][NAME] if c["role"] == "cpu_tuning"}
    live = sorted(name for name in checks if name.startswith("test_live_value["))
    assert len(live) == len(LIVE), checks  # swappiness, NUMA balancing, THP enabled and defrag
    skipped = {name: c["message"] for name, c in checks.items() if c["outcome"] != "passed"}
    assert list(skipped) == ["test_governor"], skipped
    # TCG emulates no cpufreq driver: no governor, no energy-performance preference to set.
    assert "no cpufreq driver" in skipped["test_governor"], skipped
    assert checks["test_tuned_profile_active"]["outcome"] == "passed"


@pytest.fixture(scope="module")
def up_after_reboot(vm_server, inventory, rebooted_up):
    """The first run after the reboot that reserved the 1 GiB page, with the first run's roles
    (role common's configure phase rewrites the applied plan when it changed)."""
    assert rebooted_up[0][0] == ExitCode.OK, rebooted_up[0][2]
    result = cli_json("up", "-i", inventory, *FIRST_TAGS, "--no-verify", *_vars(vm_server))
    if result[1]:
        TIMES["first run after the reboot"] = result[1]["seconds"]
    return result, ssh(vm_server, "cat /etc/provisioner/plan.json"), ssh(vm_server, "cat /proc/meminfo")


def test_the_first_run_after_the_reboot_changes_nothing(up_after_reboot, rebooted_up):
    """The reserved page leaves the plan as it was: its memory-derived values count the RAM the
    pages took (the kernel leaves boot-time 1 GiB pages out of MemTotal)."""
    (rc, data, errors, _), plan, meminfo = up_after_reboot
    before = rebooted_up[1]
    assert rc == ExitCode.OK, errors
    assert data["hosts"][NAME]["changed"] == 0, (data["changes"], _memtotal(before["meminfo"]), _memtotal(meminfo))
    assert plan == before["plan"]


def _memtotal(meminfo: str) -> str:
    return "; ".join(line for line in meminfo.splitlines() if line.startswith(("MemTotal", "Hugetlb")))


@pytest.fixture(scope="module")
def config_after_reboot(vm_server, inventory, rebooted_up):
    """`smoke --config-only` on the rebooted VM: the configuration as a job sees it (no ML
    environment here: only the configuration checks, which need none)."""
    assert rebooted_up[0][0] == ExitCode.OK, rebooted_up[0][2]
    start = time.monotonic()
    result = cli_json("smoke", "-i", inventory, "--config-only")
    TIMES["smoke --config-only"] = time.monotonic() - start
    return result


def test_after_the_reboot_the_smoke_tests_configuration_checks_pass(config_after_reboot):
    rc, data, errors, _ = config_after_reboot
    assert rc == ExitCode.OK, errors
    checks = {c["id"]: c for c in data["hosts"][NAME]["checks"]}
    assert {c["group"] for c in checks.values()} == {"host", "configuration"}, checks  # no workload ran
    config = {cid: (c["status"], c["reason"]) for cid, c in checks.items() if c["group"] == "configuration"}
    # The plan's threads in the ML user's login shell and in a service systemd started after the boot.
    for where in ("login_shell", "systemd_service"):
        assert config.pop(f"config.threads.{where}")[0] == "pass", checks
    assert config.pop("config.thp.enabled") == ("pass", "madvise, as planned")
    assert config.pop("config.thp.defrag")[0] in ("pass", "info"), checks
    status, reason = config.pop("config.data_mount")
    assert status == "pass" and re.fullmatch(r"xfs on /dev/md\d+ at /data", reason), reason
    # TCG emulates no cpufreq driver: the one check that cannot run here, saying why.
    assert config.pop("config.governor") == ("skip", "not applicable: no cpufreq driver")
    assert config == {}


def storage_up(server: lab.LabServer, inventory: str, *, key: str, verify: bool = True) -> tuple:
    """`up --tags storage` with the runs' -e options (the array as the first run built it)."""
    start = time.monotonic()
    result = cli_json("up", "-i", inventory, "--tags", "storage", *([] if verify else ["--no-verify"]), *_vars(server))
    TIMES[key] = time.monotonic() - start
    return result[:3]


@pytest.fixture(scope="module")
def drive_lost(vm_server, inventory, rebooted_up, verified, up_after_reboot, config_after_reboot):
    """Once the RAID10 is in sync (after the checks above on the whole array and the pages), DATA1
    pulled out and `undo --reboot` of hugepages and cpu_tuning: its reboot, the hugepages restore's
    own, is also the VM's boot without the drive. Undo's result, the boot before it, what undo
    left, and /data's source once md has started the array degraded."""
    assert rebooted_up[0][0] == ExitCode.OK, rebooted_up[0][2]
    start = time.monotonic()
    wait_for("the RAID10's first sync", lambda: clean(vm_server))
    TIMES["wait for the RAID10 in sync"] = time.monotonic() - start
    assert lab.set_drive(NAME, LOST, present=False)
    wait_for("md notices the pulled drive", lambda: mdstat(vm_server) if "[4/3]" in mdstat(vm_server) else None, 120)
    before = boot_id(vm_server)
    start = time.monotonic()
    result = with_console(vm_server, cli_json("undo", "-i", inventory, "--reboot", *UNDO_TAGS))
    TIMES["undo --reboot + reboot"] = time.monotonic() - start
    if result[1] and result[1].get("rebooted"):
        TIMES["undo's reboot run"] = result[1]["rebooted"]["seconds"]
    # md starts an array with a member missing only after a while (mdadm-last-resort), then the
    # nofail mount follows.
    source = wait_for(
        "/data mounted after the reboot", lambda: ssh(vm_server, "findmnt -n -o SOURCE /data", check=False) or None, 300
    )
    TIMES["undo's reboot to the degraded mount"] = time.monotonic() - start
    left = {
        "cmdline": ssh(vm_server, "cat /proc/cmdline"),
        "grub": ssh(vm_server, "grep -h '^[[:space:]]*linux' /boot/grub/grub.cfg"),
        "drop-ins": ssh(vm_server, "ls /etc/default/grub.d"),
        "tuning": live_tuning(vm_server),
        "boot_id": boot_id(vm_server),
        "pages": ssh(vm_server, f"cat {HUGEPAGES_1G}").strip(),
        "meminfo": ssh(vm_server, "cat /proc/meminfo"),
    }
    return result, before, left, source.strip()


def test_undo_takes_the_pages_off_the_kernel_command_line_and_reboots_once(drive_lost, stock_tuning):
    (rc, data, errors, messages), before, left, _ = drive_lost
    assert rc == ExitCode.OK, errors
    assert data["hosts"][NAME]["changed"] > 0
    # The reboot is the hugepages restore's own: the 1 GiB pages leave grub's line.
    assert list(data["reboot"]["reboot"]) == [NAME] and data["reboot"]["pending"] == {}, data["reboot"]
    assert "hugepages" in data["reboot"]["reboot"][NAME][0], data["reboot"]
    assert data["rebooted"]["hosts"][NAME]["failed"] == 0
    assert [m.split(":")[0] for m in messages if m.startswith("reboot")] == [f"rebooted {NAME}"], messages
    assert left["boot_id"] != before
    assert "60-provisioner-hugepages.cfg" not in left["drop-ins"].split(), left["drop-ins"]
    assert "hugepagesz=1G" not in left["grub"] and "console=ttyS0" in left["grub"], left["grub"]
    assert "hugepagesz=" not in left["cmdline"], left["cmdline"]
    assert left["pages"] == "0"
    assert re.search(r"(?m)^Hugetlb:\s+0 kB$", left["meminfo"])  # no page of any size
    # The booted kernel runs the VM's own tuning again (sysctl.d, tuned's profile).
    assert left["tuning"] == stock_tuning


def test_a_raid10_that_lost_a_drive_boots_degraded_with_the_data_intact(vm_server, rebooted_up, drive_lost):
    text = mdstat(vm_server)
    slots = re.search(r"raid10 .+\n\s+\d+ blocks super 1.2 \d+K chunks 2 near-copies \[4/3\] \[([U_]{4})\]", text)
    assert slots and slots.group(1).count("_") == 1, text
    source = drive_lost[3]
    assert re.fullmatch(r"/dev/md\d+", source), source
    assert ssh(vm_server, "readlink -f /dev/md/data").strip() == source
    assert ssh(vm_server, "sha256sum /data/probe").split()[0] == rebooted_up[1]["sha"]
    assert not ssh(vm_server, f"ls {vm_server.drives[LOST]}", check=False)


@pytest.fixture(scope="module")
def degraded_up(vm_server, inventory, drive_lost):
    return storage_up(vm_server, inventory, key="degraded run + verify")


def test_up_keeps_the_degraded_array_warns_and_verify_fails_naming_it(vm_server, degraded_up):
    rc, data, errors = degraded_up
    assert data["hosts"][NAME]["failed"] == 0, errors  # the roles succeeded; the checks did not
    # Nothing to change: the declared state names the drives as storage_devices does, lost or not.
    assert data["hosts"][NAME]["changed"] == 0, data["changes"]
    warnings = data["hosts"][NAME]["warnings"]
    lost = vm_server.drives[LOST]
    assert any(
        w.startswith("storage: the data array /dev/md/data (raid10) runs degraded on 3 of 4 drives") and lost in w
        for w in warnings
    ), warnings
    assert rc == ExitCode.HOST_FAILED, errors
    storage = data["verify"]["roles"][NAME]["storage"]
    assert storage["outcome"] == "failed", storage
    line = " ".join(storage["details"])
    assert "the data array /dev/md/data" in line and "runs degraded on 3 of 4 drives" in line and lost in line, line
    assert "put the drive back" in line, line
    assert ssh(vm_server, "mdadm --detail /dev/md/data | grep -c 'Raid Level : raid10'").strip() == "1"


def test_status_shows_the_degraded_array_drifted(vm_server, degraded_up):
    row = _status(vm_server, "status (degraded)")
    assert row["state"] == "drifted" and "degraded" in json.dumps(row), row
    assert f"{vm_server.drives[LOST]} missing" in json.dumps(row), row  # the lost drive, by its stable name


def _status(server: lab.LabServer, key: str) -> dict:
    """The data array's row of `provisioner status`."""
    start = time.monotonic()
    _, data, errors, _ = cli_json("status", "-i", str(server.inventory))
    TIMES[key] = time.monotonic() - start
    rows = list(_named(data, "data array"))
    assert len(rows) == 1, (data, errors)
    return rows[0]


def _named(data, name: str):
    """Every dict in DATA (nested) whose name is NAME."""
    if isinstance(data, dict):
        if data.get("name") == name:
            yield data
        for value in data.values():
            yield from _named(value, name)
    elif isinstance(data, list):
        for value in data:
            yield from _named(value, name)


@pytest.fixture(scope="module")
def repaired(vm_server, inventory, degraded_up):
    assert lab.set_drive(NAME, LOST, present=True)
    wait_for("the drive back in the VM", lambda: ssh(vm_server, f"ls {vm_server.drives[LOST]}", check=False) or None, 120)
    result = storage_up(vm_server, inventory, key="repair run", verify=False)
    during = mdstat(vm_server)
    start = time.monotonic()
    wait_for("the RAID10 rebuilt", lambda: clean(vm_server))
    TIMES["rebuild to clean"] = time.monotonic() - start
    again = storage_up(vm_server, inventory, key="re-run + verify")
    return result, during, again


def test_the_returning_drive_is_re_added_and_the_array_rebuilds_to_clean(vm_server, rebooted_up, repaired):
    (rc, data, errors), during, _ = repaired
    assert rc == ExitCode.OK, errors
    assert data["hosts"][NAME]["changed"] > 0 and data["hosts"][NAME]["warnings"] == []
    assert "[4/4] [UUUU]" in during or "recovery" in during, during
    member = ssh(vm_server, f"readlink -f {vm_server.drives[LOST]}").strip().rsplit("/", 1)[-1]
    assert re.search(rf"\b{member}\[\d+\]", mdstat(vm_server)), mdstat(vm_server)
    # Rebuilt: nothing degraded or recovering ("active" while writes are in flight, else "clean").
    detail = ssh(vm_server, "mdadm --detail /dev/md/data")
    found = re.search(r"State : (.+)", detail)
    assert found, detail
    assert found.group(1).strip() in ("clean", "active"), detail
    assert ssh(vm_server, "sha256sum /data/probe").split()[0] == rebooted_up[1]["sha"]


def test_once_clean_verify_passes_status_is_ok_and_a_re_run_changes_nothing(vm_server, repaired):
    _, _, (rc, data, errors) = repaired
    assert rc == ExitCode.OK, errors
    assert data["hosts"][NAME]["changed"] == 0, data["changes"]
    assert data["verify"]["roles"][NAME]["storage"]["outcome"] == "passed", data["verify"]
    row = _status(vm_server, "status (clean)")
    assert row["state"] == "ok", row


def test_a_vm_that_does_not_answer_in_time_is_stopped_and_removed(vm_requirements):
    """A boot timeout shorter than any boot: the VM is stopped, its dir gone, the console's tail in the error."""
    name = "vm-late"
    with pytest.raises(lab.LabError) as exc:
        lab.up_vm(name, boot_timeout=3)
    message = str(exc.value)
    assert f"lab VM {name} did not answer ssh on 127.0.0.1:" in message and "within 3 s" in message, message
    assert "stopped and removed; console: " in message and "console log: " in message, message
    assert name not in {s.name for s in lab.list_servers()}
    assert not (lab.LabServer.from_dict({"name": name}).root).exists()
    argv = subprocess.run(["pgrep", "-af", "qemu-system-x86_64"], capture_output=True, text=True).stdout
    assert f"-name {name} " not in argv
    lab.down(name)
