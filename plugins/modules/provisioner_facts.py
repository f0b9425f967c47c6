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
      - Also probe each unmounted whole disk with C(blkid -p) (root only) for signatures lsblk may not know
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
import json
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
        parse_mountinfo,
        path_in,
        read_line,
        read_text,
        run,
        to_int,
    )
    from ansible_collections.provisioner.ml.plugins.module_utils.provisioner_constants import SYSTEM_MOUNTPOINTS
    from ansible_collections.provisioner.ml.plugins.module_utils.provisioner_drive_rules import sort_by_id
    from ansible_collections.provisioner.ml.plugins.module_utils.provisioner_drives import by_id_links, parse_swaps, probe
except ImportError:  # run from the repository: ansible.cfg and the CLI put plugins/module_utils on the path
    from ansible.module_utils.provisioner_common import parse_mountinfo, path_in, read_line, read_text, run, to_int
    from ansible.module_utils.provisioner_constants import SYSTEM_MOUNTPOINTS
    from ansible.module_utils.provisioner_drive_rules import sort_by_id
    from ansible.module_utils.provisioner_drives import by_id_links, parse_swaps, probe

SCHEMA = 1
ISA_FLAGS = {
    "avx2": ("avx2",),
    "avx512f": ("avx512f",),
    "avx512_bf16": ("avx512_bf16",),
    "avx512_vnni": ("avx512_vnni",),
    "amx": ("amx_tile",),
    "fma": ("fma",),
}
# udev by-id links in order of preference: hardware ids first, then model+serial.
# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------


def _to_bool(value):
    """lsblk prints true/false (2.37+) or "1"/"0" (older); sysfs prints 1/0."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    return str(value).strip().lower() in ("1", "true", "yes")


def _clean(value):
    if value is None:
        return None
    value = str(value).strip()
    return value or None


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
# block devices
# --------------------------------------------------------------------------


# kernel name -> [/dev/disk/by-id/... links], best first: the storage module lists them alike.
list_by_id = by_id_links


def _skip_device(name, kind, size):
    if kind in ("ram", "rom") or name.startswith(("zram", "ram")):
        return True
    return bool((kind == "loop" or name.startswith("loop")) and not size)


def _walk(node):
    yield node
    for child in node.get("children") or []:
        yield from _walk(child)


def _mountpoints(node):
    points = node.get("mountpoints")
    if points is None:
        points = [node.get("mountpoint")]
    return [p for p in points if p]


def parse_lsblk(json_text, root_disks=(), by_id=None, mounts_by_majmin=None):
    """``lsblk -J -b -O`` (or any column list with NAME, TYPE, SIZE) -> block_devices.

    ``root_disks``: kernel names known to hold / , /boot or /boot/efi (from mountinfo), added to
    what lsblk's own mountpoints say; ``by_id``: kernel name -> by-id links; ``mounts_by_majmin``:
    "maj:min" -> mountpoints, merged with lsblk's (lsblk may miss mounts in other namespaces).
    """
    data = json.loads(json_text) if isinstance(json_text, str) else json_text
    by_id = by_id or {}
    mounts_by_majmin = mounts_by_majmin or {}
    root_disks = set(root_disks or ())
    devices = []
    for disk in data.get("blockdevices") or []:
        name = disk.get("kname") or disk.get("name")
        kind = (disk.get("type") or "").lower()
        size = to_int(disk.get("size"), 0)
        if _skip_device(name, kind, size) or kind in ("part",):
            continue
        mountpoints, partitions, signatures, holders = [], [], [], []
        for node in _walk(disk):
            node_points = _mountpoints(node) + list(mounts_by_majmin.get(node.get("maj:min"), []))
            for point in node_points:
                if point not in mountpoints:
                    mountpoints.append(point)
        for value in (disk.get("fstype"), disk.get("pttype")):
            if value and value not in signatures:
                signatures.append(value)
        for child in disk.get("children") or []:
            child_name = child.get("kname") or child.get("name")
            child_type = (child.get("type") or "").lower()
            if child_type == "part":
                partitions.append(child_name)
                if child.get("fstype") and child["fstype"] not in signatures:
                    signatures.append(child["fstype"])
                for grandchild in child.get("children") or []:
                    holder = grandchild.get("kname") or grandchild.get("name")
                    if holder not in holders:
                        holders.append(holder)
            else:
                if child_name not in holders:
                    holders.append(child_name)
                if child_type.startswith("raid") and child_type not in signatures:
                    signatures.append(child_type)
        devices.append(
            _device(
                name=name,
                path=disk.get("path") or "/dev/" + name,
                size=size,
                model=disk.get("model"),
                serial=disk.get("serial"),
                wwn=disk.get("wwn"),
                by_id=by_id.get(name, []),
                transport=disk.get("tran"),
                rotational=_to_bool(disk.get("rota")),
                removable=_to_bool(disk.get("rm")),
                read_only=_to_bool(disk.get("ro")),
                mountpoints=mountpoints,
                partitions=partitions,
                signatures=signatures,
                holders=holders,
                kind=kind,
                root_disks=root_disks,
                uuid=disk.get("uuid"),
            )
        )
    return devices


def _device(name, path, size, model, serial, wwn, by_id, transport, rotational, removable, read_only,
            mountpoints, partitions, signatures, holders, kind, root_disks, backing_file=None, uuid=None):
    loop = kind == "loop" or name.startswith("loop")
    transport = _clean(transport)
    return {
        "name": name,
        "path": path,
        "size_bytes": size,
        "model": _clean(model),
        "serial": _clean(serial),
        "wwn": _clean(wwn),
        "by_id": sort_by_id(by_id),
        "nvme": name.startswith("nvme") or transport == "nvme",
        "rotational": bool(rotational),
        "removable": bool(removable),
        "read_only": bool(read_only),
        "transport": transport,
        "root_disk": name in root_disks or any(p in SYSTEM_MOUNTPOINTS for p in mountpoints),
        "mounted": bool(mountpoints),
        "mountpoints": mountpoints,
        "partitions": partitions,
        "signatures": signatures,
        "holders": holders,
        "loop": loop,
        "backing_file": backing_file,
        "type": kind or ("loop" if loop else "disk"),
        "uuid": _clean(uuid),
    }


def parse_sysfs_block(root="/", root_disks=(), by_id=None, mounts_by_majmin=None, swaps=()):
    """The /sys/block fall-back when lsblk is missing: same fields, signatures only from holders."""
    by_id = by_id or {}
    mounts_by_majmin = mounts_by_majmin or {}
    root_disks = set(root_disks or ())
    devices = []
    for path in sorted(glob.glob(path_in(root, "/sys/block/*"))):
        name = os.path.basename(path)
        base = "/sys/block/" + name
        size = to_int(read_line(root, base + "/size"), 0) * 512
        kind = "loop" if name.startswith("loop") else "disk"
        if name.startswith(("dm-", "md")):
            continue  # holders, reported under their members
        if _skip_device(name, kind, size):
            continue
        partitions = sorted(
            os.path.basename(os.path.dirname(p)) for p in glob.glob(path_in(root, base + "/*/partition"))
        )
        holders = []
        for node in [name, *partitions]:
            directory = base + ("/" + node if node != name else "") + "/holders"
            for holder in sorted(glob.glob(path_in(root, directory + "/*"))):
                holder = os.path.basename(holder)
                if holder not in holders:
                    holders.append(holder)
        signatures = []
        for holder in holders:
            level = read_line(root, f"/sys/block/{holder}/md/level")
            if level and level not in signatures:
                signatures.append(level)
        mountpoints = []
        for node in [name, *partitions, *holders]:
            sub = base + "/" + node if node in partitions else "/sys/block/" + node
            majmin = read_line(root, sub + "/dev")
            for point in mounts_by_majmin.get(majmin, []):
                if point not in mountpoints:
                    mountpoints.append(point)
            if "/dev/" + node in swaps and "[SWAP]" not in mountpoints:
                mountpoints.append("[SWAP]")
        model = read_line(root, base + "/device/model")
        serial = read_line(root, base + "/device/serial") or read_line(root, base + "/serial")
        wwn = read_line(root, base + "/wwid") or read_line(root, base + "/device/wwid")
        devices.append(
            _device(
                name=name,
                path="/dev/" + name,
                size=size,
                model=model,
                serial=serial,
                wwn=wwn,
                by_id=by_id.get(name, []),
                transport="nvme" if name.startswith("nvme") else None,
                rotational=read_line(root, base + "/queue/rotational") == "1",
                removable=read_line(root, base + "/removable") == "1",
                read_only=read_line(root, base + "/ro") == "1",
                mountpoints=mountpoints,
                partitions=partitions,
                signatures=signatures,
                holders=holders,
                kind=kind,
                root_disks=root_disks,
                backing_file=read_line(root, base + "/loop/backing_file"),
            )
        )
    return devices


def sysfs_disks_for(root, majmin=None, name=None):
    """Whole-disk kernel names under one block device (partition -> disk, dm/md -> members)."""
    index = {}
    for dev_file in glob.glob(path_in(root, "/sys/block/*/dev")):
        index[read_line("/", dev_file)] = (os.path.basename(os.path.dirname(dev_file)), None)
    for part_file in glob.glob(path_in(root, "/sys/block/*/*/partition")):
        part_dir = os.path.dirname(part_file)
        disk = os.path.basename(os.path.dirname(part_dir))
        index[read_line("/", part_dir + "/dev")] = (disk, os.path.basename(part_dir))
    target = None
    if majmin and majmin in index:
        target = index[majmin]
    elif name:
        for disk, part in index.values():
            if name in (disk, part):
                target = (disk, part)
                break
    if target is None:
        return set()
    disk, _part = target
    if disk.startswith(("dm-", "md")):
        members = set()
        for slave in glob.glob(path_in(root, f"/sys/block/{disk}/slaves/*")):
            members |= sysfs_disks_for(root, name=os.path.basename(slave))
        return members
    return {disk}


def root_disks_from(root, mounts):
    """Kernel names of the disks that hold /, /boot or /boot/efi according to mountinfo."""
    disks = set()
    for mount in mounts:
        if mount["mountpoint"] not in SYSTEM_MOUNTPOINTS:
            continue
        found = sysfs_disks_for(root, majmin=mount["majmin"])
        source = mount.get("source") or ""
        if not found and source.startswith("/dev/"):
            real = os.path.realpath(source) if root == "/" else source
            found = sysfs_disks_for(root, name=os.path.basename(real))
        disks |= found
    return disks


def probe_device(device_path):
    """``blkid -p`` on one device (provisioner_drives.probe) -> (signature names, "ok" | "failed",
    UUID or None).

    blkid exits 0 when it found something, 2 when nothing (or on an error, which it prints),
    8 when signatures are ambiguous (several found: the drive holds something).  The UUID is the
    filesystem's (for a btrfs member, the filesystem all its members share) or the array's.
    """
    found = probe(device_path, wipefs=False)
    if found["error"]:
        return [], "failed", None
    if found["ambiguous"]:
        return ["ambiguous"], "ok", None
    names = []
    for key, value in found["tags"].items():
        if key in ("TYPE", "PTTYPE") and value not in names:
            names.append(value)
    return names, "ok", found["tags"].get("UUID")


def probe_signatures(device_path):
    """``blkid -p`` on one device -> (signature names, "ok" | "failed"); see probe_device."""
    found, status, _uuid = probe_device(device_path)
    return found, status


UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def mounted_btrfs_members(root="/"):
    """kernel name -> filesystem UUID for every device of a mounted btrfs (/sys/fs/btrfs/<fsid>/devices/).

    The kernel lists every member there, while the mount table names one of them as the source;
    readable without root and without a udev database (containers)."""
    members: dict[str, str] = {}
    for directory in sorted(glob.glob(path_in(root, "/sys/fs/btrfs/*/devices"))):
        fsid = os.path.basename(os.path.dirname(directory))
        if not UUID_RE.match(fsid):
            continue
        for entry in sorted(os.listdir(directory)):
            members.setdefault(entry, fsid)
    return members


def _add_mounts_by_source(devices, mounts, root):
    """A mount whose source names a device but whose maj:min does not (btrfs mounts carry an anonymous
    0:N) still makes that device mounted: the /sys/block fall-back matches by maj:min only."""
    for mount in mounts:
        source = mount.get("source") or ""
        if not source.startswith("/dev/"):
            continue
        name = os.path.basename(os.path.realpath(source) if root == "/" else source)
        for device in devices:
            if name in [device["name"], *device["partitions"]] and mount["mountpoint"] not in device["mountpoints"]:
                device["mountpoints"].append(mount["mountpoint"])
                device["mounted"] = True


def gather_block_devices(root="/", warnings=None, sources=None, probe=True):
    warnings = warnings if warnings is not None else []
    sources = sources if sources is not None else {}
    mounts = parse_mountinfo(read_text(root, "/proc/self/mountinfo", "") or read_text(root, "/proc/1/mountinfo", ""))
    swaps = parse_swaps(read_text(root, "/proc/swaps", ""))
    mounts_by_majmin: dict[str, list[str]] = {}
    for mount in mounts:
        mounts_by_majmin.setdefault(mount["majmin"], []).append(mount["mountpoint"])
    root_disks = root_disks_from(root, mounts)
    by_id = list_by_id(root)

    devices = None
    if root == "/":
        proc = run(["lsblk", "-J", "-b", "-O"])
        if proc is None or proc.returncode != 0:
            proc = run(["lsblk", "-J", "-b", "-o", "NAME,KNAME,PATH,MAJ:MIN,TYPE,SIZE,FSTYPE,PTTYPE,MOUNTPOINT,"
                                                    "ROTA,RM,RO,MODEL,SERIAL,WWN,TRAN,UUID"])
        if proc is not None and proc.returncode == 0:
            try:
                devices = parse_lsblk(proc.stdout, root_disks=root_disks, by_id=by_id,
                                      mounts_by_majmin=mounts_by_majmin)
                sources["block_devices"] = "lsblk"
            except ValueError as exc:
                warnings.append(f"lsblk output unreadable ({exc}); used /sys/block")
        else:
            warnings.append("lsblk unavailable or failed; used /sys/block")
    if devices is None:
        devices = parse_sysfs_block(root, root_disks=root_disks, by_id=by_id,
                                    mounts_by_majmin=mounts_by_majmin, swaps=swaps)
        sources["block_devices"] = "sysfs"
    _add_mounts_by_source(devices, mounts, root)
    btrfs_members = mounted_btrfs_members(root)

    for device in devices:
        if device["loop"] and not device.get("backing_file"):
            device["backing_file"] = read_line(root, "/sys/block/{}/loop/backing_file".format(device["name"]))
        if "[SWAP]" not in device["mountpoints"]:
            names = [device["name"]] + device["partitions"]
            if any("/dev/" + n in swaps for n in names):
                device["mountpoints"].append("[SWAP]")
                device["mounted"] = True
        device["signature_probe"] = "skipped"
        if probe and root == "/" and not device["mounted"] and hasattr(os, "geteuid") and os.geteuid() == 0:
            found, device["signature_probe"], uuid = probe_device(device["path"])
            device["uuid"] = device["uuid"] or uuid
            for signature in found:
                if signature not in device["signatures"]:
                    device["signatures"].append(signature)
        fsid = btrfs_members.get(device["name"])
        if fsid:
            device["uuid"] = device["uuid"] or fsid
            if "btrfs" not in device["signatures"]:
                device["signatures"].append("btrfs")
    return devices


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
