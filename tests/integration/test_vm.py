"""The storage, hugepages and cpu_tuning roles on a real kernel: one lab VM (qemu, Debian 12's
own kernel, grub on its disk) with two virtual NVMe drives, booted once for the module (marked lab).

What a container cannot show, proven here through `provisioner up` and `undo` themselves:
- mdadm RAID0 + XFS on both drives: the array built with the planned chunk, XFS's stripe unit
  and width matching chunk and drive count (xfs_info), mounted by UUID with nofail, the array
  named in mdadm.conf and that mdadm.conf inside the initramfs;
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
- `undo --reboot` (with the runs' roles as its --tags) takes the 1 GiB pages off the kernel
  command line and reboots once, after which no 1 GiB page is reserved and the VM boots with
  its own tuning again.

Software emulation (KVM does not run guests on every host, see provisioner/lab/vm.py) makes
every task slow, so the runs use Mitogen (PROVISIONER_STRATEGY=mitogen) and only the three roles'
tags (the first run also common's configure phase and thread_env, for the configuration checks). Times of the image build, the boot, each run and the reboots are printed (pytest -s).
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from vm_lab import assert_data_array, booted, cli_json, ssh, user_inventory

from provisioner import lab
from provisioner.errors import ExitCode

pytestmark = pytest.mark.lab

NAME = "vm-test"
CHUNK_KB = 512
TAGS = ("--tags", "storage,hugepages,cpu_tuning")
# The first run also writes what the smoke test's configuration checks read after the reboot:
# role common's ML user and recorded plan (its configure phase: the base packages are not what a
# real kernel proves) and role thread_env's thread settings (a login shell, systemd's manager).
FIRST_TAGS = ("--tags", "storage,hugepages,cpu_tuning,common_configure,thread_env")
# Undo gives back what the runs applied: the same roles (a phase tag selects its whole role),
# not the undo of roles that never ran here (under emulation each of their tasks costs a second).
UNDO_TAGS = ("--tags", ",".join(t.split("_configure")[0] for t in FIRST_TAGS[1].split(",")))
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
        "storage_level=raid0",
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


def boot_id(server: lab.LabServer) -> str:
    return ssh(server, "cat /proc/sys/kernel/random/boot_id").strip()


@pytest.fixture(scope="module")
def vm_server(vm_requirements):
    with booted(NAME, TIMES, "lab VM times", drives=2, drive_size="2G") as server:
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


def test_raid0_and_xfs_are_built_on_the_nvme_drives_and_persisted(vm_server, first_up):
    rc, data, errors, messages = first_up
    assert rc == ExitCode.OK, errors
    assert data["hosts"][NAME]["changed"] > 0
    array = assert_data_array(vm_server, "raid0", vm_server.drives, CHUNK_KB, data_drives=2)
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
    result = cli_json("up", "-i", inventory, *TAGS, "--reboot", "--no-verify", *_vars(vm_server))
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


@pytest.fixture(scope="module")
def undone(vm_server, inventory, rebooted_up, config_after_reboot, verified, up_after_reboot):
    """`undo --reboot` (the last run of the module) and what it left. Undo without --reboot, its
    pending-reboot message and the live values given back before any reboot are the unit tests'
    (test_undo.py) and this machine's own kernel's (tests/host): here, what only a real boot shows."""
    assert rebooted_up[0][0] == ExitCode.OK, rebooted_up[0][2]
    before = boot_id(vm_server)
    start = time.monotonic()
    result = cli_json("undo", "-i", inventory, "--reboot", *UNDO_TAGS)
    TIMES["undo --reboot + reboot"] = time.monotonic() - start
    if result[1] and result[1].get("rebooted"):
        TIMES["undo's reboot run"] = result[1]["rebooted"]["seconds"]
    left = {
        "cmdline": ssh(vm_server, "cat /proc/cmdline"),
        "grub": ssh(vm_server, "grep -h '^[[:space:]]*linux' /boot/grub/grub.cfg"),
        "drop-ins": ssh(vm_server, "ls /etc/default/grub.d"),
        "tuning": live_tuning(vm_server),
        "boot_id": boot_id(vm_server),
        "pages": ssh(vm_server, f"cat {HUGEPAGES_1G}").strip(),
        "meminfo": ssh(vm_server, "cat /proc/meminfo"),
    }
    return result, before, left


def test_undo_takes_the_pages_off_the_kernel_command_line_and_reboots_once(undone, stock_tuning):
    (rc, data, errors, messages), before, left = undone
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
