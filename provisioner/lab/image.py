"""The one cached disk image every lab VM's overlay sits on, built from Debian's packages.

mmdebstrap installs Debian 12 with its stock kernel into a directory (no loop devices, no
mounts); `mkfs.ext4 -d` turns it into a partition and an sfdisk label makes it a disk; one
boot of that disk with the kernel given to qemu directly installs grub on it, so every lab VM
after it boots, and reboots, through the real boot loader and reads the kernel command line
the roles write. The image is keyed by everything that decides its content (the package list,
the files baked in, the host's apt sources) and built once.

The initramfs: the chroot builds the first one with Debian's default MODULES=most (it cannot
see the guest's devices); MODULES=dep is set for every later update inside the guest, where
MODULES=most takes over 20 minutes under software emulation and dep under 3.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from provisioner import paths
from provisioner.system import locked, run

from . import vm
from .common import LabError, write_file
from .rootfs import SUITE, host_acquire_confs, host_sources

IMAGE_INCLUDE: tuple[str, ...] = (
    "linux-image-amd64",
    "initramfs-tools",
    "grub-pc",
    "systemd-sysv",
    "udev",
    "kmod",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",
    "iproute2",
    "procps",
    "ca-certificates",
    "e2fsprogs",
    "mdadm",
    "xfsprogs",
    # What role cpu_tuning installs: in the image, so a VM run never apt-installs under emulation.
    "tuned",
    "linux-cpupower",
)
ROOT_SIZE = 6 << 30
PART_START_SECTOR = 2048  # 1 MiB: room for grub's core image after the MBR
BUILD_TIMEOUT_S = 1800.0
BOOT_DONE = "provisioner-lab: boot loader installed"

# Runs at every boot before sshd: this VM's name, ssh host key and root's authorized key from
# qemu's firmware configuration; at the image build's one boot also grub onto the disk.
SEED_SCRIPT = f"""#!/bin/sh
# provisioner lab: what qemu hands this VM (fw_cfg opt/provisioner/*)
set -eu
modprobe qemu_fw_cfg 2>/dev/null || true
fw=/sys/firmware/qemu_fw_cfg/by_name/opt/provisioner
[ -d "$fw" ] || exit 0
if [ -r "$fw/hostname/raw" ]; then
    name=$(cat "$fw/hostname/raw")
    echo "$name" > /etc/hostname
    hostname "$name"
    touch /etc/hosts
    sed -i '/^127\\.0\\.1\\.1[[:space:]]/d' /etc/hosts
    printf '127.0.1.1\\t%s\\n' "$name" >> /etc/hosts
fi
if [ -r "$fw/host_key/raw" ]; then
    rm -f /etc/ssh/ssh_host_*
    (umask 077; cat "$fw/host_key/raw" > /etc/ssh/ssh_host_ed25519_key)
    cat "$fw/host_key.pub/raw" > /etc/ssh/ssh_host_ed25519_key.pub
fi
if [ -r "$fw/authorized_keys/raw" ]; then
    mkdir -p -m 0700 /root/.ssh
    (umask 077; cat "$fw/authorized_keys/raw" > /root/.ssh/authorized_keys)
fi
if [ -r "$fw/build/raw" ]; then
    grub-install --target=i386-pc /dev/vda
    echo "grub-pc grub-pc/install_devices multiselect /dev/vda" | debconf-set-selections
    update-grub
    sync
    echo "{BOOT_DONE}" > /dev/console
    systemctl --no-block poweroff
fi
"""

SEED_UNIT = """[Unit]
Description=provisioner lab: name, ssh host key and authorized key from qemu's firmware config
After=local-fs.target
Before=ssh.service network-pre.target
Wants=network-pre.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/provisioner-lab-seed
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
"""

NETWORK = "[Match]\nName=en*\n\n[Network]\nDHCP=ipv4\n"
GRUB_DEFAULTS = (
    "# provisioner lab: the serial console, no menu wait\n"
    "GRUB_TIMEOUT=1\n"
    'GRUB_CMDLINE_LINUX_DEFAULT="console=ttyS0,115200"\n'
    'GRUB_TERMINAL="serial console"\n'
    'GRUB_SERIAL_COMMAND="serial --speed=115200"\n'
    "GRUB_DISABLE_OS_PROBER=true\n"
)
SSHD_CONF = "# provisioner lab: only this VM's own host key\nHostKey /etc/ssh/ssh_host_ed25519_key\n"
INITRAMFS_CONF = "# provisioner lab: only the modules this VM's devices need (MODULES=most takes >20 min here)\nMODULES=dep\n"
# Files written into the tree after mmdebstrap (path -> (text, mode)).
BAKED: dict[str, tuple[str, int]] = {
    "usr/local/sbin/provisioner-lab-seed": (SEED_SCRIPT, 0o755),
    "etc/systemd/system/provisioner-lab-seed.service": (SEED_UNIT, 0o644),
    "etc/systemd/network/10-lab.network": (NETWORK, 0o644),
    "etc/default/grub.d/50-provisioner-lab.cfg": (GRUB_DEFAULTS, 0o644),
    "etc/ssh/sshd_config.d/provisioner-lab.conf": (SSHD_CONF, 0o644),
    "etc/initramfs-tools/conf.d/provisioner-lab": (INITRAMFS_CONF, 0o644),
    "etc/resolv.conf": ("nameserver 10.0.2.3\n", 0o644),
    "etc/hosts": ("127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n", 0o644),
}
ENABLE_UNITS = ("provisioner-lab-seed.service", "ssh.service", "systemd-networkd.service")
# apt's daily timers would take the dpkg lock at random moments (see rootfs.py). e2fsprogs' scrub
# units check ext4 metadata on LVM snapshots, which no lab VM has: under emulation the boot-time
# reap took 8-13 s of a guest CPU at every boot (the weekly scrub is masked with it).
MASK_UNITS = ("apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_reap.service", "e2scrub_all.timer")


def image_key(sources: list[str], aptopts: list[str]) -> str:
    """Hash of everything that decides the image's content."""
    recipe = {
        "suite": SUITE,
        "include": sorted(IMAGE_INCLUDE),
        "baked": {k: [v[0], v[1]] for k, v in sorted(BAKED.items())},
        "enable": list(ENABLE_UNITS),
        "mask": list(MASK_UNITS),
        "root_size": ROOT_SIZE,
        "sources": sources,
        "aptopts": aptopts,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def images_dir() -> Path:
    return paths.lab_dir() / "images"


def image_path() -> Path:
    key = image_key([p.read_text() for p in host_sources()], [p.read_text() for p in host_acquire_confs()])
    return images_dir() / f"{SUITE}-vm-{key}.qcow2"


def mmdebstrap_cmd(target: Path) -> list[str]:
    cmd = ["mmdebstrap", "--variant=minbase", f"--include={','.join(IMAGE_INCLUDE)}"]
    cmd += [f"--aptopt={p}" for p in host_acquire_confs()]
    return [*cmd, SUITE, str(target), *(str(p) for p in host_sources())]


def _bake(tree: Path, root_uuid: str) -> None:
    """The lab's files, units and fstab in the installed tree; the package's host keys out."""
    for old in (tree / "etc" / "ssh").glob("ssh_host_*"):
        old.unlink()
    for rel, (text, mode) in BAKED.items():
        target = tree / rel
        if target.is_symlink():
            target.unlink()
        write_file(target, text, mode)
    write_file(tree / "etc" / "fstab", f"UUID={root_uuid} / ext4 errors=remount-ro 0 1\n")
    write_file(tree / "etc" / "hostname", "lab-vm\n")
    wants = tree / "etc" / "systemd" / "system" / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    for unit in ENABLE_UNITS:
        link = wants / unit
        if not link.is_symlink():
            source = tree / "etc" / "systemd" / "system" / unit
            link.symlink_to(f"/etc/systemd/system/{unit}" if source.is_file() else f"/lib/systemd/system/{unit}")
    for unit in MASK_UNITS:
        link = tree / "etc" / "systemd" / "system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")


def _kernel(tree: Path) -> tuple[Path, Path]:
    kernels = sorted((tree / "boot").glob("vmlinuz-*"))
    initrds = sorted((tree / "boot").glob("initrd.img-*"))
    if not kernels or not initrds:
        raise LabError(f"the image tree {tree} has no kernel or initramfs in /boot: see its build log")
    return kernels[-1], initrds[-1]


def _raw_disk(tree: Path, work: Path, root_uuid: str, log: Path) -> Path:
    """A raw disk: an MBR label with one bootable ext4 partition holding TREE."""
    part = work / "root.ext4"
    disk = work / "disk.raw"
    with open(log, "a") as out:
        run(
            ["mkfs.ext4", "-q", "-F", "-L", "lab-root", "-U", root_uuid, "-d", str(tree), str(part), f"{ROOT_SIZE // 1024}k"],
            "making the VM image's root filesystem failed",
            f"see {log}",
            error=LabError,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    with open(disk, "wb") as f:
        f.truncate(PART_START_SECTOR * 512 + ROOT_SIZE)
    run(
        ["sfdisk", "-q", str(disk)],
        "labelling the VM image failed",
        error=LabError,
        input=f"label: dos\nstart={PART_START_SECTOR}, type=83, bootable\n",
        stdin=None,
    )
    with open(part, "rb") as src, open(disk, "r+b") as dst:
        dst.seek(PART_START_SECTOR * 512)
        while chunk := src.read(4 << 20):
            if chunk.count(0) == len(chunk):
                dst.seek(len(chunk), os.SEEK_CUR)
            else:
                dst.write(chunk)
    part.unlink()
    return disk


def _install_boot_loader(qcow2: Path, tree_kernel: tuple[Path, Path], work: Path, log: Path) -> None:
    """Boot the new disk once with its kernel given directly: grub goes onto it, then it powers off."""
    console = work / "console.log"
    marker = work / "build"
    marker.write_text("1\n")
    cmd = vm.qemu_cmd(
        "pv-image-build",
        qcow2,
        console,
        vm.free_port(),
        [],
        vm.accelerator(kernel=tree_kernel[0]),
        {"build": str(marker)},
        kernel=(tree_kernel[0], tree_kernel[1], "root=/dev/vda1 rw console=ttyS0,115200"),
    )
    proc = vm.spawn(cmd, console, log)
    code = vm.wait_exit(proc, BUILD_TIMEOUT_S)
    if code is None:
        proc.kill()
        proc.wait()
        raise LabError(
            f"the VM image's boot loader install did not finish in {BUILD_TIMEOUT_S:.0f} s; console: {vm.console_tail(console)}"
        )
    text = console.read_text(errors="replace") if console.is_file() else ""
    with contextlib.suppress(OSError), open(log, "a") as out:
        out.write(text)
    if BOOT_DONE not in text:
        raise LabError(f"installing grub on the VM image failed (qemu exit {code}); console: {vm.console_tail(console)}")


def build_image(target: Path) -> dict[str, float]:
    """Build the image at TARGET (renamed into place at the end); the seconds of each step."""
    work = target.with_name(f".build-{os.getpid()}-{target.stem}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, mode=0o700)
    log = target.with_suffix(".build.log")
    log.write_text("")
    times: dict[str, float] = {}
    try:
        tree = work / "tree"
        start = time.monotonic()
        with open(log, "a") as out:
            run(
                mmdebstrap_cmd(tree),
                "building the VM image with mmdebstrap failed",
                f"see {log}",
                error=LabError,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        times["mmdebstrap_s"] = time.monotonic() - start
        start = time.monotonic()
        root_uuid = str(uuid.uuid4())
        _bake(tree, root_uuid)
        kernel = _kernel(tree)
        boot = work / "boot"
        boot.mkdir()
        boot_files = (Path(shutil.copy2(kernel[0], boot)), Path(shutil.copy2(kernel[1], boot)))
        disk = _raw_disk(tree, work, root_uuid, log)
        shutil.rmtree(tree)
        qcow2 = work / "disk.qcow2"
        run(
            [vm.QEMU_IMG, "convert", "-q", "-O", "qcow2", str(disk), str(qcow2)], "converting the VM image failed", error=LabError
        )
        disk.unlink()
        times["disk_s"] = time.monotonic() - start
        start = time.monotonic()
        _install_boot_loader(qcow2, boot_files, work, log)
        times["boot_loader_s"] = time.monotonic() - start
        qcow2.chmod(0o444)
        os.replace(qcow2, target)
        write_file(target.with_suffix(".times.json"), json.dumps(times) + "\n")
        return times
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure_image() -> Path:
    """The cached VM disk image (read-only: every VM writes to its own overlay); built once."""
    vm.check_vm_environment()
    target = image_path()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(target.parent / ".image.lock"):
        if not target.is_file():
            build_image(target)
    return target
