#!/usr/bin/python
# Copyright: provisioner contributors
# Apache License 2.0 (see pyproject.toml)
"""Gather the hardware facts that the tuning plan is derived from.

The same code runs on every target, local or remote.  Parsing lives in pure
functions at module level so that the unit tests can import this file and feed
it sample text or a fake /proc + /sys tree (``gather(root=...)``).

Standard library only, for any python3 that ansible-core supports on a target;
py-cpuinfo and psutil are used as fall-backs when they are importable.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: provisioner_facts
short_description: Gather CPU, memory, cpufreq, THP, block device, virtualization and OS facts
description:
  - Reads C(/proc), C(/sys), C(/etc/os-release) and the output of C(lsblk -J -b -O) on the target and
    returns them as the C(provisioner_hardware) fact (schema 1), the only input of the tuning plan.
  - Falls back to C(/sys/block) when C(lsblk) is missing or fails; RAM and zram devices are skipped;
    loop devices are listed only while attached (size above 0), flagged C(loop=true).
  - Uses C(py-cpuinfo) and C(psutil) only as fall-backs when they are installed; needs neither.
  - Changes nothing; runs the same in check mode.
version_added: "0.1.0"
author:
  - provisioner contributors
options:
  root:
    description:
      - Directory to read C(proc/), C(sys/), C(etc/) and C(dev/disk/by-id) from.
      - Anything but C(/) is for tests; external commands (lsblk, blkid, systemd-detect-virt) only run for C(/).
    type: path
    default: /
  probe_signatures:
    description:
      - Also probe each unmounted whole disk, and each disk mounted as a whole (no partitions), with C(blkid -p)
        (root only) for signatures and the filesystem UUID lsblk may not know
        (no udev database, as in containers), so that no drive holding data is ever taken for unused.
      - Each device says how in C(signature_probe) (C(ok), C(failed) or C(skipped)); the plan never proposes
        a drive whose probe failed.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
notes:
  - Linux only.
"""

EXAMPLES = r"""
- name: Gather hardware facts
  provisioner_facts:

- name: Show the physical core count
  ansible.builtin.debug:
    msg: "{{ ansible_facts.provisioner_hardware.cpu.cores }} cores"
"""

RETURN = r"""
ansible_facts:
  description: Facts under the single key C(provisioner_hardware).
  returned: always
  type: complex
  contains:
    provisioner_hardware:
      description:
        - C(schema) (1), C(cpu), C(memory), C(cpufreq), C(thp), C(block_devices), C(virtualization), C(os),
          C(sources) (where each part came from) and C(warnings) (what could not be read).
        - C(cpu.caches) holds C(l1d_kb) and C(l2_kb) per core, C(l3_kb) per L3 instance (CCD or socket),
          C(l3_instances) and C(l3_total_kb) over all sockets.
        - C(cpu.core_cpus) lists the logical CPUs of each physical core (SMT siblings together), or is
          null when sysfs shows no sibling lists.
        - C(block_devices[].uuid) is the UUID of what the whole drive holds (the filesystem all members of a
          btrfs share, an md member's array), from lsblk, blkid -p or /sys/fs/btrfs, or null.
        - C(memory.total_bytes) is MemTotal; C(memory.installed_bytes) the RAM online in the kernel's
          memory blocks (the same across boots, unlike MemTotal), or null where there are none.
      type: dict
      returned: always
      sample:
        schema: 1
        cpu: {vendor: AuthenticAMD, cores: 16, threads: 32, sockets: 1, numa_nodes: 1}
        memory: {total_bytes: 202119233536, installed_bytes: 206158430208, hugepage_size_kb: 2048, hugepages_1g_supported: true}
"""

import glob
import os
import platform
import re

try:  # optional, only a fall-back
    import cpuinfo  # py-cpuinfo
except Exception:  # pragma: no cover - depends on the target
    cpuinfo = None

try:  # optional, only a fall-back
    import psutil
except Exception:  # pragma: no cover - depends on the target
    psutil = None

from ansible.module_utils.basic import AnsibleModule

try:  # installed as the provisioner.ml collection
    from ansible_collections.provisioner.ml.plugins.module_utils.provisioner_common import (
        path_in,
        read_line,
        read_text,
        run,
        to_int,
    )
    from ansible_collections.provisioner.ml.plugins.module_utils.provisioner_drive_list import gather_block_devices
except ImportError:  # run from the repository: ansible.cfg and the CLI put plugins/module_utils on the path
    from ansible.module_utils.provisioner_common import path_in, read_line, read_text, run, to_int
    from ansible.module_utils.provisioner_drive_list import gather_block_devices

SCHEMA = 1
ISA_FLAGS = {
    "avx2": ("avx2",),
    "avx512f": ("avx512f",),
    "avx512_bf16": ("avx512_bf16",),
    "avx512_vnni": ("avx512_vnni",),
    "amx": ("amx_tile",),
    "fma": ("fma",),
}
# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------


def parse_cpu_list(text):
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    if not text:
        return cpus
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            low, high = part.split("-", 1)
            cpus.extend(range(int(low), int(high) + 1))
        else:
            cpus.append(int(part))
    return cpus


def parse_size_kb(text):
    """Cache sizes from sysfs: '48K', '2048K', '32M' -> KiB."""
    if not text:
        return None
    match = re.match(r"^\s*(\d+)\s*([KMG]?)", text.strip(), re.IGNORECASE)
    if not match:
        return None
    number, unit = int(match.group(1)), match.group(2).upper()
    return number * {"": 1, "K": 1, "M": 1024, "G": 1024 * 1024}[unit] if unit else number // 1024


def parse_bracketed(text):
    """'always [madvise] never' -> 'madvise'."""
    if not text:
        return None
    match = re.search(r"\[([^\]]+)\]", text)
    if match:
        return match.group(1)
    text = text.strip()
    return text or None


# --------------------------------------------------------------------------
# CPU
# --------------------------------------------------------------------------


def parse_cpuinfo(text):
    """Parse /proc/cpuinfo.

    Returns vendor, model_name, family, model, flags (sorted), threads (processor entries),
    sockets and cores (from physical id / core id, None when absent) and mhz (first cpu).
    """
    blocks = []
    current: dict[str, str] = {}
    for line in (text or "").splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        if ":" not in line:
            continue
        key, _, value = line.partition(":")
        current[key.strip().lower()] = value.strip()
    if current:
        blocks.append(current)

    processors = [b for b in blocks if "processor" in b and to_int(b.get("processor")) is not None]
    first = processors[0] if processors else (blocks[0] if blocks else {})
    flags_text = first.get("flags") or first.get("features") or ""
    packages = set()
    cores = set()
    for block in processors:
        package = block.get("physical id")
        core = block.get("core id")
        if package is not None:
            packages.add(package)
        if package is not None and core is not None:
            cores.add((package, core))
    model_name = first.get("model name") or first.get("cpu model") or first.get("hardware")
    return {
        "vendor": first.get("vendor_id") or first.get("cpu implementer"),
        "model_name": model_name,
        "family": to_int(first.get("cpu family")),
        "model": to_int(first.get("model")),
        "stepping": to_int(first.get("stepping")),
        "flags": sorted(set(flags_text.split())),
        "threads": len(processors),
        "sockets": len(packages) or None,
        "cores": len(cores) or None,
        "mhz": _to_float(first.get("cpu mhz")),
    }


def _to_float(value):
    try:
        return float(str(value).strip())
    except (TypeError, ValueError):
        return None


def isa_from_flags(flags):
    flags = set(flags or ())
    return {name: any(f in flags for f in wanted) for name, wanted in sorted(ISA_FLAGS.items())}


def parse_topology(root="/"):
    """Sockets, cores and threads from /sys/devices/system/cpu/cpuN/topology (online CPUs)."""
    base = "/sys/devices/system/cpu"
    online = parse_cpu_list(read_line(root, base + "/online", ""))
    if not online:
        online = sorted(
            to_int(os.path.basename(p)[3:])
            for p in glob.glob(path_in(root, base + "/cpu[0-9]*"))
            if to_int(os.path.basename(p)[3:]) is not None
        )
    packages, cores = set(), set()
    sibling_lists = set()
    for cpu in online:
        topo = f"{base}/cpu{cpu:d}/topology"
        package = read_line(root, topo + "/physical_package_id")
        siblings = read_line(root, topo + "/core_cpus_list") or read_line(root, topo + "/thread_siblings_list")
        if package is None and siblings is None:
            continue
        packages.add(package)
        if siblings is not None:
            cores.add(tuple(parse_cpu_list(siblings)))
            sibling_lists.add(tuple(c for c in parse_cpu_list(siblings) if c in online))
        else:
            cores.add((package, read_line(root, topo + "/die_id"), read_line(root, topo + "/core_id")))
    return {
        "threads": len(online) or None,
        "sockets": len(packages - {None}) or None,
        "cores": len(cores) or None,
        "online": online,
        # The logical CPUs of each physical core, in core order (None when sysfs has no
        # sibling lists): the serving plan slices workers by these.
        "core_cpus": sorted(list(c) for c in sibling_lists if c) or None,
    }


def parse_caches(root="/", cpu=0):
    """Cache sizes from sysfs: L1d and L2 per core, L3 per instance and in total."""
    base = "/sys/devices/system/cpu"
    caches = {"l1d_kb": None, "l2_kb": None, "l3_kb": None, "l3_instances": None, "l3_total_kb": None}
    for index in sorted(glob.glob(path_in(root, f"{base}/cpu{cpu:d}/cache/index[0-9]*"))):
        level = to_int(read_line("/", index + "/level"))
        kind = (read_line("/", index + "/type") or "").lower()
        size = parse_size_kb(read_line("/", index + "/size"))
        if level == 1 and kind == "data":
            caches["l1d_kb"] = size
        elif level == 2 and kind in ("unified", "data"):
            caches["l2_kb"] = size
        elif level == 3:
            caches["l3_kb"] = size
    if caches["l3_kb"] is not None:
        instances = set()
        for path in glob.glob(path_in(root, base + "/cpu[0-9]*/cache/index3/shared_cpu_list")):
            with open(path) as handle:
                instances.add(handle.read().strip())
        caches["l3_instances"] = len(instances) or 1
        caches["l3_total_kb"] = caches["l3_kb"] * caches["l3_instances"]
    return caches


def count_numa_nodes(root="/"):
    online = read_line(root, "/sys/devices/system/node/online")
    if online:
        return len(parse_cpu_list(online)) or 1
    nodes = glob.glob(path_in(root, "/sys/devices/system/node/node[0-9]*"))
    return len(nodes) or 1


def max_mhz_from(root="/", cpu=0):
    for name in ("cpuinfo_max_freq", "scaling_max_freq"):
        khz = to_int(read_line(root, f"/sys/devices/system/cpu/cpu{cpu:d}/cpufreq/{name}"))
        if khz:
            return round(khz / 1000.0, 1)
    return None


def mhz_from_model_name(model_name):
    """'Intel(R) Xeon(R) Gold 6430 @ 2.10GHz' -> 2100.0 (the base clock), else None."""
    match = re.search(r"@\s*([\d.]+)\s*GHz", model_name or "", re.IGNORECASE)
    return round(float(match.group(1)) * 1000.0, 1) if match else None


def gather_cpu(root="/", warnings=None):
    warnings = warnings if warnings is not None else []
    info = parse_cpuinfo(read_text(root, "/proc/cpuinfo", ""))
    topo = parse_topology(root)
    live = root == "/"

    if live and cpuinfo is not None and (not info["model_name"] or not info["flags"]):
        try:
            extra = cpuinfo.get_cpu_info()
            info["vendor"] = info["vendor"] or extra.get("vendor_id_raw")
            info["model_name"] = info["model_name"] or extra.get("brand_raw")
            info["family"] = info["family"] if info["family"] is not None else extra.get("family")
            info["model"] = info["model"] if info["model"] is not None else extra.get("model")
            info["flags"] = info["flags"] or sorted(extra.get("flags") or [])
        except Exception as exc:  # pragma: no cover - fall-back only
            warnings.append(f"py-cpuinfo failed: {exc}")

    threads = topo["threads"] or info["threads"] or None
    cores = topo["cores"] or info["cores"]
    sockets = topo["sockets"] or info["sockets"]
    if live and psutil is not None:
        threads = threads or psutil.cpu_count(logical=True)
        cores = cores or psutil.cpu_count(logical=False)
    threads = threads or os.cpu_count() or 1
    if not cores:
        warnings.append("physical core count unknown; assuming one thread per core")
        cores = threads
    sockets = sockets or 1
    threads_per_core = max(1, threads // cores) if cores else 1

    affinity = None
    if live and hasattr(os, "sched_getaffinity"):
        try:
            affinity = len(os.sched_getaffinity(0))
        except OSError:  # pragma: no cover
            affinity = None

    max_mhz = max_mhz_from(root) or mhz_from_model_name(info["model_name"])
    flags = info["flags"]
    return {
        "vendor": info["vendor"] or "unknown",
        "model_name": info["model_name"] or "unknown",
        "family": info["family"] if info["family"] is not None else 0,
        "model": info["model"] if info["model"] is not None else 0,
        "stepping": info["stepping"],
        "sockets": sockets,
        "cores": cores,
        "threads": threads,
        "threads_per_core": threads_per_core,
        "numa_nodes": count_numa_nodes(root),
        "affinity_cpus": affinity,
        "core_cpus": topo["core_cpus"] if topo["core_cpus"] and len(topo["core_cpus"]) == cores else None,
        "isa": isa_from_flags(flags),
        "flags": flags,
        "caches": parse_caches(root),
        "max_mhz": max_mhz,
        "current_mhz": info["mhz"],
    }


# --------------------------------------------------------------------------
# memory, cpufreq, THP
# --------------------------------------------------------------------------


def parse_meminfo(text):
    """/proc/meminfo -> {key: bytes or count}; 'kB' values become bytes."""
    values = {}
    for line in (text or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts:
            continue
        number = to_int(parts[0])
        if number is None:
            continue
        if len(parts) > 1 and parts[1].lower() == "kb":
            number *= 1024
        values[key.strip()] = number
    return values


def installed_memory(root="/"):
    """The RAM the kernel has online, from its memory blocks (/sys/devices/system/memory: the block
    size x the online blocks), to the block (128 MiB on x86): what the machine has, the same from
    one boot to the next. MemTotal is less by what the kernel kept at boot (its code, the crash
    kernel, boot-time reservations), which moves with the kernel command line. None where the
    kernel has no memory blocks (no memory hotplug) or reports none online."""
    base = "/sys/devices/system/memory"
    try:
        block = int(read_line(root, base + "/block_size_bytes", "") or "", 16)
    except ValueError:
        return None
    online = sum(
        1 for state in glob.glob(path_in(root, base + "/memory*/state"))
        if read_line("/", state, "") == "online"
    )
    return block * online or None


def gather_memory(root="/", flags=(), warnings=None):
    warnings = warnings if warnings is not None else []
    meminfo = parse_meminfo(read_text(root, "/proc/meminfo", ""))
    total = meminfo.get("MemTotal")
    if not total and root == "/" and psutil is not None:
        total = psutil.virtual_memory().total
    if not total:
        warnings.append("MemTotal unknown")
        total = 0
    hp_base = "/sys/kernel/mm/hugepages"
    sizes = sorted(
        to_int(os.path.basename(p)[len("hugepages-"):-2])
        for p in glob.glob(path_in(root, hp_base + "/hugepages-*kB"))
    )
    sizes = [s for s in sizes if s]
    nr = {}
    for size in sizes:
        nr[size] = to_int(read_line(root, f"{hp_base}/hugepages-{size:d}kB/nr_hugepages"), 0)
    hugepage_size_kb = (meminfo.get("Hugepagesize") or 2048 * 1024) // 1024
    return {
        "total_bytes": total,
        "installed_bytes": installed_memory(root),
        "available_bytes": meminfo.get("MemAvailable"),
        "swap_total_bytes": meminfo.get("SwapTotal"),
        "hugepage_size_kb": hugepage_size_kb,
        "hugepages_1g_supported": 1048576 in sizes or "pdpe1gb" in set(flags or ()),
        "hugepage_sizes_kb": sizes,
        "nr_hugepages_2m": nr.get(2048, 0),
        "nr_hugepages_1g": nr.get(1048576, 0),
    }


def gather_cpufreq(root="/"):
    base = "/sys/devices/system/cpu"
    policy = None
    for candidate in (base + "/cpu0/cpufreq", base + "/cpufreq/policy0"):
        if os.path.isdir(path_in(root, candidate)):
            policy = candidate
            break
    result = {
        "driver": None,
        "governor": None,
        "available_governors": [],
        "epp": None,
        "available_epp": [],
        "boost": None,
        "amd_pstate_status": read_line(root, base + "/amd_pstate/status"),
        "intel_pstate_status": read_line(root, base + "/intel_pstate/status"),
    }
    if policy is not None:
        result["driver"] = read_line(root, policy + "/scaling_driver")
        result["governor"] = read_line(root, policy + "/scaling_governor")
        result["available_governors"] = (read_line(root, policy + "/scaling_available_governors") or "").split()
        result["epp"] = read_line(root, policy + "/energy_performance_preference")
        result["available_epp"] = (
            read_line(root, policy + "/energy_performance_available_preferences") or ""
        ).split()
    boost = read_line(root, base + "/cpufreq/boost")
    no_turbo = read_line(root, base + "/intel_pstate/no_turbo")
    if boost is not None:
        result["boost"] = boost == "1"
    elif no_turbo is not None:
        result["boost"] = no_turbo == "0"
    return result


def gather_thp(root="/"):
    base = "/sys/kernel/mm/transparent_hugepage"
    return {
        "enabled": parse_bracketed(read_line(root, base + "/enabled")),
        "defrag": parse_bracketed(read_line(root, base + "/defrag")),
    }


# --------------------------------------------------------------------------
# virtualization, OS
# --------------------------------------------------------------------------

DMI_VM = (
    ("qemu", "qemu"),
    ("kvm", "kvm"),
    ("vmware", "vmware"),
    ("virtualbox", "oracle"),
    ("innotek", "oracle"),
    ("xen", "xen"),
    ("microsoft corporation", "microsoft"),
    ("amazon ec2", "amazon"),
    ("google compute engine", "google"),
    ("bochs", "bochs"),
    ("parallels", "parallels"),
)


def detect_vm(root="/", flags=()):
    """VM type from DMI, /sys/hypervisor and the cpu 'hypervisor' flag (systemd-detect-virt names)."""
    dmi = " ".join(
        (read_line(root, "/sys/class/dmi/id/" + key) or "").lower()
        for key in ("sys_vendor", "product_name", "bios_vendor", "board_vendor")
    )
    for needle, name in DMI_VM:
        if needle in dmi:
            return name
    hypervisor = read_line(root, "/sys/hypervisor/type")
    if hypervisor:
        return hypervisor.lower()
    if "hypervisor" in set(flags or ()):
        return "vm-other"
    return "none"


def detect_container(root="/"):
    marker = read_line(root, "/run/systemd/container")
    if marker:
        return marker
    if os.path.exists(path_in(root, "/run/.containerenv")):
        return "podman"
    if os.path.exists(path_in(root, "/.dockerenv")):
        return "docker"
    environ = read_text(root, "/proc/1/environ", "") or ""
    for item in environ.split("\0"):
        if item.startswith("container="):
            return item.split("=", 1)[1] or "container-other"
    return "none"


def gather_virtualization(root="/", flags=()):
    vm = container = None
    if root == "/":
        proc = run(["systemd-detect-virt", "--vm"])
        if proc is not None and proc.stdout.strip():
            vm = proc.stdout.strip()
        proc = run(["systemd-detect-virt", "--container"])
        if proc is not None and proc.stdout.strip():
            container = proc.stdout.strip()
    vm = vm or detect_vm(root, flags)
    container = container or detect_container(root)
    kind = container if container != "none" else vm
    return {"type": kind, "role": "guest" if kind != "none" else "host", "vm": vm, "container": container}


def parse_os_release(text):
    values = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def gather_os(root="/"):
    release = parse_os_release(read_text(root, "/etc/os-release") or read_text(root, "/usr/lib/os-release", ""))
    kernel = read_line(root, "/proc/sys/kernel/osrelease") or (platform.release() if root == "/" else None)
    return {
        "id": release.get("ID"),
        "version_id": release.get("VERSION_ID"),
        "codename": release.get("VERSION_CODENAME"),
        "pretty_name": release.get("PRETTY_NAME"),
        "kernel": kernel,
        "arch": platform.machine(),
        "python": platform.python_version(),
    }


# --------------------------------------------------------------------------
# everything
# --------------------------------------------------------------------------


def gather(root="/", probe=True):
    """All facts (schema 1).  ``root`` other than "/" reads a fake tree and runs no commands."""
    root = root or "/"
    warnings: list[str] = []
    sources = {"cpu": "procfs+sysfs"}
    cpu = gather_cpu(root, warnings)
    facts = {
        "schema": SCHEMA,
        "cpu": cpu,
        "memory": gather_memory(root, cpu["flags"], warnings),
        "cpufreq": gather_cpufreq(root),
        "thp": gather_thp(root),
        "block_devices": gather_block_devices(root, warnings, sources, probe=probe),
        "virtualization": gather_virtualization(root, cpu["flags"]),
        "os": gather_os(root),
        "sources": sources,
        "warnings": warnings,
    }
    return facts


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/"),
            probe_signatures=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    try:
        facts = gather(module.params["root"], probe=module.params["probe_signatures"])
    except Exception as exc:  # a bug: say where, not a traceback the user must read
        module.fail_json(msg=f"provisioner_facts could not read the hardware: {type(exc).__name__}: {exc}")
    module.exit_json(changed=False, ansible_facts={"provisioner_hardware": facts})


if __name__ == "__main__":
    main()
