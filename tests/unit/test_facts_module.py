"""The provisioner_facts module: parsers on sample text, gather() on a fake tree and on this
machine, and the module and the plan role run for real through ansible and ansible-playbook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import playbook_cases
import plugin_code
import pytest
import sysfs_cases
import yaml
from fake_tree import write

REPO = Path(__file__).resolve().parents[2]
MODULE_PATH = plugin_code.PLUGINS / "modules" / "provisioner_facts.py"
VENV_BIN = Path(sys.executable).parent
ANSIBLE = VENV_BIN / "ansible"
ANSIBLE_PLAYBOOK = VENV_BIN / "ansible-playbook"


pf = plugin_code.load("modules", "provisioner_facts")
dl = sys.modules[pf.gather_block_devices.__module__]  # provisioner_drive_list: the block devices
DRIVES = sys.modules[dl.probe.__module__]  # provisioner_drives: the probes run its commands


# --------------------------------------------------------------------------
# parsers on sample text
# --------------------------------------------------------------------------

CPUINFO_2S = "\n".join(
    f"""processor\t: {cpu}
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8462Y+
stepping\t: 8
cpu MHz\t\t: 2800.000
cache size\t: 61440 KB
physical id\t: {cpu // 4}
siblings\t: 4
core id\t\t: {(cpu // 2) % 2}
cpu cores\t: 2
flags\t\t: fpu sse2 ht pdpe1gb avx fma avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8
"""
    for cpu in range(8)
)


def test_parse_cpuinfo_two_sockets():
    info = pf.parse_cpuinfo(CPUINFO_2S)
    assert info["vendor"] == "GenuineIntel"
    assert info["model_name"] == "Intel(R) Xeon(R) Platinum 8462Y+"
    assert (info["family"], info["model"], info["stepping"]) == (6, 143, 8)
    assert info["threads"] == 8
    assert info["sockets"] == 2
    assert info["cores"] == 4
    assert info["mhz"] == 2800.0
    assert "amx_tile" in info["flags"] and info["flags"] == sorted(info["flags"])


def test_parse_cpuinfo_without_topology_lines():
    text = "processor : 0\nvendor_id : AuthenticAMD\nmodel name : AMD EPYC\nflags : avx2 fma\n\nprocessor : 1\n"
    info = pf.parse_cpuinfo(text)
    assert info["threads"] == 2
    assert info["cores"] is None and info["sockets"] is None
    assert info["flags"] == ["avx2", "fma"]


def test_parse_cpuinfo_empty():
    info = pf.parse_cpuinfo("")
    assert info["threads"] == 0 and info["flags"] == [] and info["model_name"] is None


def test_isa_from_flags():
    isa = pf.isa_from_flags(["avx2", "fma", "avx512f", "avx512_bf16", "amx_tile"])
    assert isa == {"amx": True, "avx2": True, "avx512_bf16": True, "avx512_vnni": False, "avx512f": True, "fma": True}
    assert not any(pf.isa_from_flags(["sse2"]).values())


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0-3", [0, 1, 2, 3]), ("0,2,4-5", [0, 2, 4, 5]), ("7", [7]), ("", []), ("0-1\n", [0, 1])],
)
def test_parse_cpu_list(text, expected):
    assert pf.parse_cpu_list(text) == expected


@pytest.mark.parametrize(("text", "kb"), [("48K", 48), ("2048K", 2048), ("32M", 32768), ("1G", 1048576), ("", None)])
def test_parse_size_kb(text, kb):
    assert pf.parse_size_kb(text) == kb


@pytest.mark.parametrize(("text", "value"), sysfs_cases.BRACKETED)
def test_parse_bracketed(text, value):
    assert pf.parse_bracketed(text) == value


def test_parse_meminfo_converts_kb_to_bytes():
    values = pf.parse_meminfo("MemTotal:       24684084 kB\nHugePages_Total:       0\nHugepagesize:       2048 kB\n")
    assert values == {"MemTotal": 24684084 * 1024, "HugePages_Total": 0, "Hugepagesize": 2048 * 1024}


def test_parse_mountinfo_and_swaps():
    mounts = dl.common.parse_mountinfo(
        "27 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n"
        "30 27 259:1 / /boot/efi rw,relatime shared:5 - vfat /dev/nvme0n1p1 rw\n"
        "31 27 0:45 / /mnt/with\\040space rw - tmpfs tmpfs rw\n"
    )
    assert mounts[0] == {"majmin": "259:2", "mountpoint": "/", "fstype": "ext4", "source": "/dev/nvme0n1p2"}
    assert mounts[2]["mountpoint"] == "/mnt/with space"
    swaps = dl.parse_swaps(
        "Filename\tType\tSize\tUsed\tPriority\n/dev/nvme0n1p3   partition\t8388604\t0\t-2\n/swapfile file 1 0 -3\n"
    )
    assert swaps == ["/dev/nvme0n1p3"]


def test_parse_os_release():
    values = pf.parse_os_release('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n# c\n')
    assert values == {"PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)", "ID": "debian", "VERSION_ID": "12"}


def test_mhz_from_model_name():
    assert pf.mhz_from_model_name("11th Gen Intel(R) Core(TM) i7-1165G7 @ 2.80GHz") == 2800.0
    assert pf.mhz_from_model_name("AMD EPYC 4545P 16-Core Processor") is None


def test_sort_by_id_prefers_hardware_ids():
    links = [
        "/dev/disk/by-id/nvme-SAMSUNG_X_S1",
        "/dev/disk/by-id/nvme-eui.0025",
        "/dev/disk/by-id/wwn-0x5002",
        "/dev/disk/by-id/zzz-other",
    ]
    assert dl.sort_by_id(links) == [
        "/dev/disk/by-id/wwn-0x5002",
        "/dev/disk/by-id/nvme-eui.0025",
        "/dev/disk/by-id/nvme-SAMSUNG_X_S1",
        "/dev/disk/by-id/zzz-other",
    ]


def _node(name, kind="disk", size=0, children=(), mountpoints=(None,), fstype=None, **extra):
    node = {
        "name": name,
        "kname": name,
        "path": f"/dev/{name}",
        "maj:min": extra.pop("majmin", "259:0"),
        "type": kind,
        "size": size,
        "fstype": fstype,
        "pttype": extra.pop("pttype", None),
        "mountpoints": list(mountpoints),
        "rota": extra.pop("rota", False),
        "rm": extra.pop("rm", False),
        "ro": False,
        "model": extra.pop("model", None),
        "serial": extra.pop("serial", None),
        "wwn": extra.pop("wwn", None),
        "tran": extra.pop("tran", None),
    }
    if children:
        node["children"] = list(children)
    node.update(extra)
    return node


LSBLK = json.dumps(
    {
        "blockdevices": [
            _node("zram0", size=0),
            _node("loop0", kind="loop", size=0),
            _node("loop1", kind="loop", size=1073741824, majmin="7:1"),
            _node(
                "nvme0n1",
                size=512110190592,
                pttype="gpt",
                model="SAMSUNG MZVL2512HCJQ-00B00  ",
                serial="S675NX0T401234",
                wwn="eui.002538b431a01234",
                tran="nvme",
                children=[
                    _node("nvme0n1p1", kind="part", size=536870912, fstype="vfat", mountpoints=["/boot/efi"]),
                    _node("nvme0n1p2", kind="part", size=511572000000, fstype="ext4", mountpoints=["/"]),
                ],
            ),
            _node("nvme1n1", size=3840755982336, model="SAMSUNG MZQL23T8HCLS-00A07", serial="S64HNE0T500101", tran="nvme"),
            _node(
                "nvme2n1",
                size=3840755982336,
                fstype="linux_raid_member",
                tran="nvme",
                children=[_node("md0", kind="raid1", size=3840000000000, fstype="xfs", mountpoints=["/srv"])],
            ),
            _node("sda", size="480103981056", rota="1", rm="0", fstype="xfs", tran="sata"),  # lsblk < 2.33 prints strings
            _node("sr0", kind="rom", size=1073741312, rm=True),
        ]
    }
)


def test_parse_lsblk():
    devices = {d["name"]: d for d in dl.parse_lsblk(LSBLK, by_id={"nvme1n1": ["/dev/disk/by-id/nvme-SAMSUNG_X", "/dev/disk/by-id/nvme-eui.1"]})}
    assert set(devices) == {"loop1", "nvme0n1", "nvme1n1", "nvme2n1", "sda"}  # no zram, rom or empty loop

    root = devices["nvme0n1"]
    assert root["root_disk"] is True and root["mounted"] is True
    assert root["mountpoints"] == ["/boot/efi", "/"]
    assert root["partitions"] == ["nvme0n1p1", "nvme0n1p2"]
    assert root["signatures"] == ["gpt", "vfat", "ext4"]
    assert root["model"] == "SAMSUNG MZVL2512HCJQ-00B00" and root["nvme"] is True

    free = devices["nvme1n1"]
    assert free["root_disk"] is False and free["mounted"] is False
    assert free["partitions"] == [] and free["signatures"] == [] and free["holders"] == []
    assert free["by_id"] == ["/dev/disk/by-id/nvme-eui.1", "/dev/disk/by-id/nvme-SAMSUNG_X"]
    assert free["size_bytes"] == 3840755982336 and free["path"] == "/dev/nvme1n1"

    member = devices["nvme2n1"]
    assert member["holders"] == ["md0"]
    assert member["signatures"] == ["linux_raid_member", "raid1"]
    assert member["mountpoints"] == ["/srv"] and member["root_disk"] is False

    sata = devices["sda"]
    assert sata["size_bytes"] == 480103981056 and sata["rotational"] is True and sata["removable"] is False
    assert sata["nvme"] is False and sata["signatures"] == ["xfs"]

    loop = devices["loop1"]
    assert loop["loop"] is True and loop["nvme"] is False and loop["size_bytes"] == 1073741824


def test_parse_lsblk_root_disks_and_extra_mounts():
    devices = {d["name"]: d for d in dl.parse_lsblk(LSBLK, root_disks={"nvme1n1"}, mounts_by_majmin={"7:1": ["/mnt/x"]})}
    assert devices["nvme1n1"]["root_disk"] is True
    assert devices["loop1"]["mountpoints"] == ["/mnt/x"] and devices["loop1"]["mounted"] is True


def test_parse_lsblk_old_mountpoint_column():
    text = json.dumps({"blockdevices": [{"name": "vdb", "type": "disk", "size": "1000", "mountpoint": "/", "rota": "1"}]})
    (device,) = dl.parse_lsblk(text)
    assert device["root_disk"] is True and device["path"] == "/dev/vdb" and device["size_bytes"] == 1000


# --------------------------------------------------------------------------
# gather() on a fake /proc + /sys tree
# --------------------------------------------------------------------------


@pytest.fixture
def fake_root(tmp_path: Path) -> Path:
    """Two sockets x 2 cores x 2 threads, 2 NUMA nodes, intel_pstate, four drives, loops, zram."""
    root = tmp_path / "root"
    write(root, "/proc/cpuinfo", CPUINFO_2S)
    write(root, "/sys/devices/system/cpu/online", "0-7\n")
    for cpu in range(8):
        base = f"/sys/devices/system/cpu/cpu{cpu}"
        sibling = cpu - cpu % 2
        write(root, f"{base}/topology/physical_package_id", f"{cpu // 4}\n")
        write(root, f"{base}/topology/core_id", f"{(cpu // 2) % 2}\n")
        write(root, f"{base}/topology/die_id", "0\n")
        write(root, f"{base}/topology/thread_siblings_list", f"{sibling}-{sibling + 1}\n")
        write(root, f"{base}/cache/index3/shared_cpu_list", "0-3\n" if cpu < 4 else "4-7\n")
    for index, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"), (3, "Unified", "61440K")]):
        base = f"/sys/devices/system/cpu/cpu0/cache/index{index}"
        write(root, f"{base}/level", f"{level}\n")
        write(root, f"{base}/type", f"{kind}\n")
        write(root, f"{base}/size", f"{size}\n")
    write(root, "/sys/devices/system/cpu/cpu0/cache/index3/shared_cpu_list", "0-3\n")
    freq = "/sys/devices/system/cpu/cpu0/cpufreq"
    write(root, f"{freq}/scaling_driver", "intel_pstate\n")
    write(root, f"{freq}/scaling_governor", "powersave\n")
    write(root, f"{freq}/scaling_available_governors", "performance powersave\n")
    write(root, f"{freq}/energy_performance_preference", "balance_performance\n")
    write(root, f"{freq}/energy_performance_available_preferences", "default performance balance_performance power\n")
    write(root, f"{freq}/cpuinfo_max_freq", "4100000\n")
    write(root, "/sys/devices/system/cpu/intel_pstate/status", "active\n")
    write(root, "/sys/devices/system/cpu/intel_pstate/no_turbo", "0\n")
    write(root, "/sys/devices/system/node/online", "0-1\n")
    write(root, "/proc/meminfo", "MemTotal:       528125000 kB\nMemAvailable:   520000000 kB\nSwapTotal:  0 kB\nHugepagesize:       2048 kB\n")
    write(root, "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "16\n")
    write(root, "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages", "0\n")
    write(root, "/sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n")
    write(root, "/sys/kernel/mm/transparent_hugepage/defrag", "always defer defer+madvise [madvise] never\n")
    write(root, "/sys/class/dmi/id/sys_vendor", "Supermicro\n")
    write(root, "/etc/os-release", 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\n')
    write(root, "/proc/sys/kernel/osrelease", "6.1.0-28-amd64\n")

    def disk(name, majmin, sectors, model=None, serial=None, partitions=(), holders=(), rotational="0"):
        base = f"/sys/block/{name}"
        write(root, f"{base}/dev", f"{majmin}\n")
        write(root, f"{base}/size", f"{sectors}\n")
        write(root, f"{base}/queue/rotational", f"{rotational}\n")
        write(root, f"{base}/removable", "0\n")
        write(root, f"{base}/ro", "0\n")
        (root / base.lstrip("/") / "holders").mkdir(parents=True, exist_ok=True)
        if model:
            write(root, f"{base}/device/model", f"{model}  \n")
        if serial:
            write(root, f"{base}/device/serial", f"{serial}\n")
        for part, part_majmin in partitions:
            write(root, f"{base}/{part}/partition", "1\n")
            write(root, f"{base}/{part}/dev", f"{part_majmin}\n")
            (root / base.lstrip("/") / part / "holders").mkdir(parents=True, exist_ok=True)
        for holder in holders:
            write(root, f"{base}/holders/{holder}", "")

    disk("nvme0n1", "259:0", 1000215216, "SAMSUNG MZVL2512HCJQ-00B00", "S675", partitions=[("nvme0n1p1", "259:1"), ("nvme0n1p2", "259:2")])
    disk("nvme1n1", "259:3", 7501476528, "SAMSUNG MZQL23T8HCLS-00A07", "S64H1")
    disk("nvme2n1", "259:4", 7501476528, "SAMSUNG MZQL23T8HCLS-00A07", "S64H2", holders=["md0"])
    disk("md0", "9:0", 7500000000)
    write(root, "/sys/block/md0/md/level", "raid1\n")
    write(root, "/sys/block/md0/slaves/nvme2n1", "")
    disk("loop0", "7:0", 0)
    disk("loop1", "7:1", 4194304)
    write(root, "/sys/block/loop1/loop/backing_file", "/var/tmp/disk1.img\n")
    disk("zram0", "253:0", 1024)
    write(
        root,
        "/proc/self/mountinfo",
        "27 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n"
        "28 27 259:1 / /boot/efi rw,relatime shared:2 - vfat /dev/nvme0n1p1 rw\n"
        "29 27 9:0 / /srv rw,relatime shared:3 - xfs /dev/md0 rw\n",
    )
    by_id = root / "dev" / "disk" / "by-id"
    by_id.mkdir(parents=True)
    os.symlink("../../nvme1n1", by_id / "nvme-SAMSUNG_MZQL23T8HCLS-00A07_S64H1")
    os.symlink("../../nvme1n1", by_id / "nvme-eui.0001")
    os.symlink("../../nvme0n1p1", by_id / "nvme-SAMSUNG_MZVL2512HCJQ-00B00_S675-part1")
    return root


def test_gather_on_a_fake_tree(fake_root):
    facts = pf.gather(str(fake_root))
    assert facts["schema"] == 1
    cpu = facts["cpu"]
    assert (cpu["vendor"], cpu["family"], cpu["model"]) == ("GenuineIntel", 6, 143)
    assert (cpu["sockets"], cpu["cores"], cpu["threads"], cpu["threads_per_core"]) == (2, 4, 8, 2)
    assert cpu["numa_nodes"] == 2
    assert cpu["isa"]["amx"] and cpu["isa"]["avx512_bf16"] and cpu["isa"]["fma"]
    assert cpu["caches"] == {"l1d_kb": 48, "l2_kb": 2048, "l3_kb": 61440, "l3_instances": 2, "l3_total_kb": 122880}
    assert cpu["max_mhz"] == 4100.0
    assert cpu["affinity_cpus"] is None  # not this machine's
    # Each physical core with its SMT sibling, in core order: the serving plan slices by these.
    assert len(cpu["core_cpus"]) == cpu["cores"]
    assert sorted(c for core in cpu["core_cpus"] for c in core) == list(range(cpu["threads"]))
    assert all(len(core) == 2 for core in cpu["core_cpus"])

    memory = facts["memory"]
    assert memory["total_bytes"] == 528125000 * 1024
    assert memory["hugepage_size_kb"] == 2048
    assert memory["hugepages_1g_supported"] is True
    assert (memory["nr_hugepages_2m"], memory["nr_hugepages_1g"]) == (16, 0)

    assert facts["cpufreq"] == {
        "driver": "intel_pstate",
        "governor": "powersave",
        "available_governors": ["performance", "powersave"],
        "epp": "balance_performance",
        "available_epp": ["default", "performance", "balance_performance", "power"],
        "boost": True,
        "amd_pstate_status": None,
        "intel_pstate_status": "active",
    }
    assert facts["thp"] == {"enabled": "madvise", "defrag": "madvise"}
    assert facts["virtualization"] == {"type": "none", "role": "host", "vm": "none", "container": "none"}
    assert facts["os"]["id"] == "debian" and facts["os"]["version_id"] == "12"
    assert facts["os"]["kernel"] == "6.1.0-28-amd64"
    assert facts["sources"]["block_devices"] == "sysfs"

    devices = {d["name"]: d for d in facts["block_devices"]}
    assert set(devices) == {"nvme0n1", "nvme1n1", "nvme2n1", "loop1"}
    root_disk = devices["nvme0n1"]
    assert root_disk["root_disk"] and root_disk["mounted"]
    assert root_disk["partitions"] == ["nvme0n1p1", "nvme0n1p2"]
    assert sorted(root_disk["mountpoints"]) == ["/", "/boot/efi"]
    free = devices["nvme1n1"]
    assert not free["root_disk"] and not free["mounted"] and free["nvme"]
    assert free["size_bytes"] == 7501476528 * 512
    assert free["model"] == "SAMSUNG MZQL23T8HCLS-00A07" and free["serial"] == "S64H1"
    assert free["by_id"] == ["/dev/disk/by-id/nvme-eui.0001", "/dev/disk/by-id/nvme-SAMSUNG_MZQL23T8HCLS-00A07_S64H1"]
    member = devices["nvme2n1"]
    assert member["holders"] == ["md0"] and member["signatures"] == ["raid1"] and member["mountpoints"] == ["/srv"]
    loop = devices["loop1"]
    assert loop["loop"] and loop["backing_file"] == "/var/tmp/disk1.img" and not loop["nvme"]


def test_gather_fake_tree_feeds_the_plan(fake_root):
    from provisioner.plan import PlanOptions, derive_plan

    plan = derive_plan(pf.gather(str(fake_root)), PlanOptions())
    assert plan.value("threads_per_job") == 4
    assert plan.value("cpu_governor") == "performance"
    assert plan.storage is not None
    assert plan.storage["proposed"] is False  # one free NVMe drive only
    excluded = {e["name"]: e["reason"] for e in plan.storage["excluded"]}
    assert excluded["nvme0n1"].startswith("root disk")
    assert excluded["nvme2n1"].startswith("mounted at /srv")


def test_gather_on_an_empty_tree_does_not_crash(tmp_path):
    facts = pf.gather(str(tmp_path))
    assert facts["cpu"]["cores"] >= 1 and facts["cpu"]["threads"] >= 1
    assert facts["block_devices"] == []
    assert facts["cpufreq"]["driver"] is None
    assert facts["warnings"]


# --------------------------------------------------------------------------
# this machine
# --------------------------------------------------------------------------


def test_gather_on_this_machine():
    facts = pf.gather()
    json.dumps(facts)
    cpu = facts["cpu"]
    assert cpu["cores"] >= 1
    assert cpu["threads"] >= cpu["cores"]
    assert cpu["threads_per_core"] >= 1
    assert cpu["sockets"] >= 1 and cpu["numa_nodes"] >= 1
    assert set(cpu["isa"]) >= {"avx2", "avx512f", "avx512_bf16", "amx", "fma"}
    assert set(cpu["caches"]) >= {"l1d_kb", "l2_kb", "l3_kb", "l3_total_kb"}
    assert facts["memory"]["total_bytes"] > 0
    assert facts["memory"]["hugepage_size_kb"] > 0
    assert set(facts["cpufreq"]) >= {"driver", "governor", "available_governors", "epp"}
    assert set(facts["thp"]) == {"enabled", "defrag"}
    assert facts["virtualization"]["role"] in ("guest", "host")
    assert facts["os"]["kernel"] and facts["os"]["python"].startswith("3.")
    keys = {"name", "path", "size_bytes", "model", "serial", "wwn", "by_id", "nvme", "rotational", "removable",
            "root_disk", "mounted", "mountpoints", "partitions", "signatures", "holders", "loop"}
    for device in facts["block_devices"]:
        assert keys <= set(device), device
        assert not device["name"].startswith(("zram", "ram"))
        assert device["size_bytes"] > 0
    if facts["block_devices"]:
        assert any(d["root_disk"] for d in facts["block_devices"]) or facts["virtualization"]["container"] != "none"


# --------------------------------------------------------------------------
# through Ansible, for real
# --------------------------------------------------------------------------


def _ansible_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        ANSIBLE_ROLES_PATH=str(REPO / "roles"),
        ANSIBLE_LIBRARY=str(plugin_code.PLUGINS / "modules"),
        ANSIBLE_MODULE_UTILS=str(plugin_code.PLUGINS / "module_utils"),
        ANSIBLE_ACTION_PLUGINS=str(plugin_code.PLUGINS / "action"),
        ANSIBLE_FILTER_PLUGINS=str(plugin_code.PLUGINS / "filter"),
        ANSIBLE_HOME=str(tmp_path / "ansible-home"),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
        ANSIBLE_REMOTE_TEMP=str(tmp_path / "ansible-remote-tmp"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_RETRY_FILES_ENABLED="0",
        ANSIBLE_DEPRECATION_WARNINGS="0",
    )
    env.pop("ANSIBLE_CONFIG", None)
    return env


needs_ansible = pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="ansible-playbook not in the venv")

PLAYBOOK = """\
- name: Plan this machine
  hosts: all
  gather_facts: false
  roles:
    - plan
  tasks:
    - name: Write the plan
      ansible.builtin.copy:
        content: "{{{{ provisioner_plan | to_json }}}}"
        dest: "{out}"
        mode: "0644"
      delegate_to: localhost
      check_mode: false
"""


def _run_playbook(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "plan.json"
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK.format(out=out))
    command = [
        str(ANSIBLE_PLAYBOOK),
        "-i", "localhost,",
        "-c", "local",
        "-e", f"ansible_python_interpreter={sys.executable}",
        str(playbook),
        *extra,
    ]
    proc = subprocess.run(command, env=_ansible_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    return proc, out


@needs_ansible
def test_module_through_ansible_adhoc(tmp_path):
    proc = subprocess.run(
        [str(ANSIBLE), "localhost", "-c", "local", "-m", "provisioner_facts", "-M", str(MODULE_PATH.parent),
         "-e", f"ansible_python_interpreter={sys.executable}", "-o"],
        env=_ansible_env(tmp_path), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
    payload = json.loads(proc.stdout.split("=>", 1)[1])
    assert payload["changed"] is False
    facts = payload["ansible_facts"]["provisioner_hardware"]
    assert facts["schema"] == 1 and facts["cpu"]["cores"] >= 1 and facts["memory"]["total_bytes"] > 0


# The plan of this machine and the bad options of each case below in one ansible-playbook run
# (playbook_cases): one host per case, its variables the case's input (strings, as -e KEY=VALUE
# gives them). Each host writes its plan to its own file. Check mode is a run of its own.
NORMAL = "normal"
BAD_OPTIONS = {
    "zero": ({"plan_trials": "0"}, "plan_trials must be 1 or more (got 0)"),
    "above-cores": ({"plan_trials": "100000"}, "plan_allow_oversubscription: true"),
    "typo": ({"plan_trails": "3"}, "unknown plan option plan_trails; known: plan_trials"),
}
CASES_PLAYBOOK = yaml.safe_load(PLAYBOOK.format(out="{{ cases_dir }}/{{ inventory_hostname }}.json"))


@pytest.fixture(scope="module")
def plan_run(tmp_path_factory):
    hosts = {NORMAL: {"plan_thp": "always"}, **{name: variables for name, (variables, _) in BAD_OPTIONS.items()}}
    return playbook_cases.run_cases(
        tmp_path_factory, "plan-role", CASES_PLAYBOOK, {h: playbook_cases.local_host(v) for h, v in hosts.items()},
        env=lambda workdir: {**_ansible_env(workdir), "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"},
    )


def _assert_the_plan_of_this_machine(plan: dict) -> None:
    values = plan["values"]
    cores = pf.gather()["cpu"]["cores"]
    assert values["threads_per_job"] == cores
    assert values["trials"] == cores
    assert values["threads_per_trial"] == 1
    assert values["thp_enabled"] == "always"
    assert values["openmp_runtime"] == "libgomp"
    assert all(s["reason"] for s in plan["settings"])
    assert plan["storage"]["confirmed"] is False


@needs_ansible
def test_plan_role_through_ansible_playbook(plan_run):
    stats = plan_run.stats(NORMAL)
    assert stats["failures"] == 0 and stats["unreachable"] == 0, plan_run.tail()
    _assert_the_plan_of_this_machine(json.loads((Path(plan_run.workdir) / f"{NORMAL}.json").read_text()))


@needs_ansible
def test_plan_role_through_ansible_playbook_in_check_mode(tmp_path):
    proc, out = _run_playbook(tmp_path, "--check", "-e", "plan_thp=always")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    _assert_the_plan_of_this_machine(json.loads(out.read_text()))
    recap = proc.stdout[proc.stdout.rindex("PLAY RECAP"):]
    assert "failed=0" in recap


@needs_ansible
def test_a_run_with_bad_plan_options_fails(plan_run):
    assert plan_run.returncode == 2, plan_run.tail()


@needs_ansible
@pytest.mark.parametrize(("host", "reason"), [(h, reason) for h, (_, reason) in BAD_OPTIONS.items()], ids=list(BAD_OPTIONS))
def test_plan_role_refuses_bad_options_with_one_line(plan_run, host, reason):
    assert not (Path(plan_run.workdir) / f"{host}.json").exists()
    failed = plan_run.failed(host)
    assert len(failed) == 1, plan_run.tail()
    name, result = failed[0]
    assert name == "plan : Derive the tuning plan"
    message = result["msg"]
    assert reason in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("returncode", "stdout", "stderr", "expected"),
    [
        (0, "DEVNAME=/dev/loop0\nUUID=x\nTYPE=ext4\nUSAGE=filesystem\n", "", (["ext4"], "ok")),
        (0, "DEVNAME=/dev/sdb\nPTTYPE=gpt\n", "", (["gpt"], "ok")),
        (2, "", "", ([], "ok")),
        (2, "", "blkid: error: /dev/vda: Operation not permitted\n", ([], "failed")),
        (8, "", "", (["ambiguous"], "ok")),
        (4, "", "usage", ([], "failed")),
    ],
)
def test_probe_signatures(monkeypatch, returncode, stdout, stderr, expected):
    def fake_run(argv, timeout=30):
        assert argv[:2] == ["blkid", "-p"]
        return subprocess.CompletedProcess(argv, returncode, stdout, stderr)

    monkeypatch.setattr(DRIVES, "run", fake_run)
    assert dl.probe_signatures("/dev/x") == expected


def test_probe_signatures_without_blkid(monkeypatch):
    monkeypatch.setattr(DRIVES, "run", lambda argv, timeout=30: None)
    assert dl.probe_signatures("/dev/x") == ([], "failed")


def test_fake_tree_is_never_probed(fake_root):
    assert {d["signature_probe"] for d in pf.gather(str(fake_root))["block_devices"]} == {"skipped"}


def test_installed_memory_is_the_kernels_online_memory_blocks(tmp_path):
    """The RAM the kernel has online, block by block: the same after a boot that reserved 1 GiB
    pages (MemTotal is not); offline blocks do not count; no memory blocks, no figure."""
    root = tmp_path / "host"
    base = "/sys/devices/system/memory"
    write(root, f"{base}/block_size_bytes", "8000000\n")  # 128 MiB, in hex as the kernel writes it
    for i in range(34):
        write(root, f"{base}/memory{i}/state", "online\n" if i < 32 else "offline\n")
    write(root, "/proc/meminfo", "MemTotal:        3012345 kB\nHugepagesize:       2048 kB\n")
    memory = pf.gather_memory(str(root))
    assert memory["installed_bytes"] == 32 * 128 * 1024**2 == 4 * 1024**3
    assert memory["total_bytes"] == 3012345 * 1024
    bare = tmp_path / "bare"
    write(bare, "/proc/meminfo", "MemTotal:        3012345 kB\n")
    assert pf.gather_memory(str(bare))["installed_bytes"] is None
