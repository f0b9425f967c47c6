"""Lab VM times: the disk image build, boot to ssh and a reboot through grub, as medians.

    .venv/bin/python benchmarks/lab_vm.py [--runs 3] [--rebuild] [--name vm-bench]

- image build: with --rebuild the cached image is built again once into a scratch lab dir
  (mmdebstrap, the disk, grub installed by its one boot; each step's seconds); without it the
  times recorded when the cached image was built are shown;
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


def reboot_seconds(server: lab.LabServer, timeout: float = 900) -> float:
    old = _ssh(server, "cat /proc/sys/kernel/random/boot_id").stdout.strip()
    start = time.monotonic()
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
    parser.add_argument("--rebuild", action="store_true", help="build the image again in a scratch lab dir")
    args = parser.parse_args(argv)

    problem = lab.missing_requirement() or lab.missing_vm_requirement()
    if problem:
        print(f"skipped: {problem}", file=sys.stderr)
        return 2
    if args.rebuild:
        with tempfile.TemporaryDirectory(dir="/var/tmp") as scratch:
            target = Path(scratch) / "image.qcow2"
            start = time.monotonic()
            steps = image.build_image(target)
            steps["total_s"] = time.monotonic() - start
    else:
        path = image.ensure_image()
        times = path.with_suffix(".times.json")
        steps = json.loads(times.read_text()) if times.is_file() else {}
    print("image build: " + (", ".join(f"{k.removesuffix('_s')} {v:.0f} s" for k, v in steps.items()) or "no record"))
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
