"""What the smoke test reads on the host, as root with the system Python and the standard library:
the CPU (model, cores, flags, cpufreq), how busy it is, the DIMMs (dmidecode), and the
configuration as the workloads see it (thread settings in a login shell and in a systemd
service, THP, governor, the data mount). The parent (provisioner.smoke.target.parent) puts
them in the raw result; the control node judges them (provisioner.smoke.config)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from typing import Any

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def read(path: str, default: str | None = None) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return default


def bracketed(value: str | None) -> str | None:
    """The chosen word of a sysfs choice file ('always defer [defer+madvise] madvise never'), else None."""
    m = re.search(r"\[([^\]]+)\]", value or "")
    return m.group(1) if m else None


def _cpuinfo() -> list[dict[str, str]]:
    """/proc/cpuinfo, one dict of fields per logical CPU."""
    blocks = [b for b in (read("/proc/cpuinfo", "") or "").split("\n\n") if b.strip()]
    return [{k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in b.splitlines() if ":" in ln)} for b in blocks]


def core_groups() -> list[list[int]]:
    """The logical CPUs this process may use, one list per physical core (its SMT siblings), in the
    order of each core's first CPU."""
    allowed = os.sched_getaffinity(0)
    cores: dict[tuple[str, str], list[int]] = {}
    for fields in _cpuinfo():
        try:
            cpu = int(fields.get("processor", "-1"))
        except ValueError:
            continue
        if cpu in allowed:
            cores.setdefault((fields.get("physical id", "0"), fields.get("core id", str(cpu))), []).append(cpu)
    return sorted(sorted(group) for group in cores.values())


def core_cpus() -> list[int]:
    """One logical CPU per physical core this process may use (the first of its SMT siblings)."""
    return [group[0] for group in core_groups()]


def cpu_info() -> dict[str, Any]:
    """Vendor, family, model, flags, physical cores of the CPUs this process may use."""
    blocks = _cpuinfo()
    first = blocks[0] if blocks else {}
    allowed = os.sched_getaffinity(0)
    cores = core_cpus()
    max_khz = read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    return {
        "vendor": first.get("vendor_id", ""),
        "family": int(first.get("cpu family", "0") or 0),
        "model": int(first.get("model", "0") or 0),
        "model_name": first.get("model name", ""),
        "flags": sorted(set(first.get("flags", "").split())),
        "logical_cpus": len(allowed),
        "physical_cores": max(1, len(cores)),
        "nominal_mhz": float(first["cpu MHz"]) if first.get("cpu MHz") else None,
        "max_mhz": int(max_khz) / 1000 if max_khz and max_khz.isdigit() else None,
        "cpufreq": os.path.isdir("/sys/devices/system/cpu/cpu0/cpufreq"),
    }


def _cpu_times() -> tuple[int, int]:
    fields = [int(v) for v in (read("/proc/stat", "") or "cpu 0 0 0 0").splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]), idle


def cpu_busy(seconds: float = 1.0) -> float:
    """Share of all CPUs busy over `seconds` (another workload, a package install, a build)."""
    total0, idle0 = _cpu_times()
    time.sleep(seconds)
    total1, idle1 = _cpu_times()
    return max(0.0, 1 - (idle1 - idle0) / max(1, total1 - total0))


def memory_devices() -> dict[str, Any]:
    """Populated DIMMs and their configured speed, from SMBIOS (dmidecode, as root)."""
    exe = shutil.which("dmidecode")
    if not exe:
        return {"source": None, "why": "dmidecode is not installed"}
    r = subprocess.run([exe, "-t", "17"], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        return {"source": None, "why": f"dmidecode failed: {(r.stderr or r.stdout).strip()[:200]}"}
    dimms = []
    for block in r.stdout.split("Memory Device")[1:]:
        size = re.search(r"^\s*Size:\s*(.+)$", block, re.M)
        if not size or "No Module" in size.group(1) or "Not Installed" in size.group(1):
            continue
        speed = re.search(r"^\s*Configured (?:Memory|Clock) Speed:\s*(\d+)\s*(MT/s|MHz)", block, re.M)
        rated = re.search(r"^\s*Speed:\s*(\d+)\s*(MT/s|MHz)", block, re.M)
        kind = re.search(r"^\s*Type:\s*(\S+)", block, re.M)
        locator = re.search(r"^\s*Locator:\s*(.+)$", block, re.M)
        dimms.append(
            {
                "size": size.group(1).strip(),
                "type": kind.group(1) if kind else None,
                "configured_mts": int(speed.group(1)) if speed else None,
                "rated_mts": int(rated.group(1)) if rated else None,
                "locator": locator.group(1).strip() if locator else None,
            }
        )
    return {"source": "dmidecode -t 17", "dimms": dimms}


def env_of(argv: list[str]) -> dict[str, str] | str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]}: {exc}"
    if r.returncode != 0:
        return f"{' '.join(argv[:3])}... exited {r.returncode}: {(r.stderr or r.stdout).strip()[:200]}"
    env = {}
    for line in r.stdout.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            env[k] = v
    return env


def thread_settings(env: dict[str, str] | str) -> dict[str, Any]:
    if isinstance(env, str):
        return {"error": env}
    keys = [k for k in env if k in THREAD_VARS or k.startswith(("KMP_", "OMP_")) or k == "LD_PRELOAD"]
    return {"values": {k: env[k] for k in sorted(keys)}}


def configuration(user: str | None, data_dir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if user:
        out["login_shell"] = thread_settings(env_of(["runuser", "-l", user, "-c", "env"]))
        if os.path.isdir("/run/systemd/system") and shutil.which("systemd-run"):
            out["systemd_service"] = thread_settings(
                env_of(["systemd-run", "--wait", "--pipe", "--quiet", "--collect", "-p", f"User={user}", "/usr/bin/env"])
            )
        else:
            out["systemd_service"] = {"not_applicable": "systemd is not running here (PID 1 is not systemd)"}
    out["thp"] = {name: bracketed(read(f"/sys/kernel/mm/transparent_hugepage/{name}")) for name in ("enabled", "defrag")}
    governor = read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    out["governor"] = {"value": governor} if governor else {"not_applicable": "no cpufreq driver"}
    out["data_mount"] = data_mount(data_dir)
    return out


def data_mount(path: str) -> dict[str, Any]:
    r = subprocess.run(
        ["findmnt", "-J", "-T", path, "-o", "TARGET,SOURCE,FSTYPE,OPTIONS"], capture_output=True, text=True, check=False
    )
    try:
        fs = json.loads(r.stdout)["filesystems"][0]
    except (ValueError, KeyError, IndexError):
        return {"path": path, "error": (r.stderr or "findmnt found nothing").strip()}
    return {
        "path": path,
        "target": fs.get("target"),
        "source": fs.get("source"),
        "fstype": fs.get("fstype"),
        "options": fs.get("options", "").split(","),
    }
