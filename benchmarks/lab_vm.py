"""Lab VM times: the disk image build, boot to ssh and a reboot through grub, as medians.

    .venv/bin/python benchmarks/lab_vm.py [--runs 3] [--rebuild] [--name vm-bench]

- image build: the median of every build recorded in the lab's image cache (each recipe's
  build keeps its steps' seconds: mmdebstrap, the disk, grub installed by its one boot), plus
  --rebuild N builds of the current recipe into a scratch dir (the cache is not touched);
- boot to ssh: `lab up --vm` with two NVMe drives until the guest's sshd answers on its
  forwarded port, --runs times (a fresh overlay each time);
- reboot to ssh: `systemctl reboot` inside the VM until sshd answers again with a new boot id
  (the real boot loader, the firmware and the kernel all run again), --runs times in one VM;
- idle CPU: the share of one host core a booted, idle VM's qemu takes (over 20 s), which
  decides whether a test keeps a VM running between uses or boots it again.

Needs root, qemu and mmdebstrap (see provisioner.lab). Figures, never pass/fail: software
emulation shares this machine's cores with everything else.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provisioner import lab
from provisioner.lab import image, vm


def _ssh(server: lab.LabServer, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-F", str(server.ssh_config), server.name, command], capture_output=True, text=True, timeout=timeout
    )


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} s (min {min(values):.0f}, max {max(values):.0f}, n={len(values)})"


def build_medians(steps: list[dict[str, float]]) -> str:
    """Each step's median over the builds, and the whole build's."""
    totals = [sum(v for k, v in s.items() if k != "total_s") for s in steps]
    keys = [k for k in steps[0] if k != "total_s"]
    parts = [f"{k.removesuffix('_s')} {statistics.median([s[k] for s in steps if k in s]):.0f} s" for k in keys]
    return f"{_median(totals)}: " + ", ".join(parts)


def recorded_builds() -> list[dict[str, float]]:
    """The step times of every image build this lab kept (one file per recipe built here)."""
    out = []
    for path in sorted(image.images_dir().glob("*.times.json")):
        try:
            steps = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(steps, dict) and steps:
            out.append({k: float(v) for k, v in steps.items()})
    return out


def reboot_seconds(server: lab.LabServer, timeout: float = 900) -> float:
    old = _ssh(server, "cat /proc/sys/kernel/random/boot_id").stdout.strip()
    start = time.monotonic()
    # The connection may drop, or hang until the guest's network goes down: either is fine.
    with contextlib.suppress(subprocess.TimeoutExpired):
        _ssh(server, "systemctl reboot", timeout=30)
    while time.monotonic() - start < timeout:
        try:
            r = _ssh(server, "cat /proc/sys/kernel/random/boot_id", timeout=30)
        except subprocess.TimeoutExpired:
            continue
        if r.returncode == 0 and r.stdout.strip() not in ("", old):
            return time.monotonic() - start
        time.sleep(2)
    raise RuntimeError(f"{server.name} did not come back within {timeout:.0f} s")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_share(server: lab.LabServer, seconds: float = 20.0) -> float:
    before = cpu_seconds(server.pid)
    time.sleep(seconds)
    return (cpu_seconds(server.pid) - before) / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--name", default="vm-bench")
    parser.add_argument("--rebuild", type=int, default=0, metavar="N", help="also build the image N times in a scratch dir")
    args = parser.parse_args(argv)

    problem = lab.missing_requirement() or lab.missing_vm_requirement()
    if problem:
        print(f"skipped: {problem}", file=sys.stderr)
        return 2
    image.ensure_image()
    builds = recorded_builds()
    for run in range(1, args.rebuild + 1):
        with tempfile.TemporaryDirectory(dir="/var/tmp") as scratch:
            steps = image.build_image(Path(scratch) / "image.qcow2")
        print(f"image build {run}: " + ", ".join(f"{k.removesuffix('_s')} {v:.0f} s" for k, v in steps.items()))
        builds.append(steps)
    print(f"median image build: {build_medians(builds) if builds else 'no build recorded'}")
    print(f"accelerator: {vm.accelerator()}")

    boots: list[float] = []
    reboots: list[float] = []
    idle = 0.0
    try:
        lab.down(args.name)
        for run in range(1, args.runs + 1):
            start = time.monotonic()
            server = lab.up_vm(args.name, drives=2, drive_size="2G")
            boots.append(time.monotonic() - start)
            print(f"boot {run}: {boots[-1]:.0f} s to ssh")
            if run < args.runs:
                lab.down(args.name)
        idle = idle_share(server)
        for run in range(1, args.runs + 1):
            reboots.append(reboot_seconds(server))
            print(f"reboot {run}: {reboots[-1]:.0f} s to ssh")
    finally:
        lab.down(args.name)
    print(f"median boot to ssh: {_median(boots)}")
    print(f"median reboot to ssh: {_median(reboots)}; reboot / boot {statistics.median(reboots) / statistics.median(boots):.2f}")
    print(f"idle VM: {idle:.0%} of one core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
