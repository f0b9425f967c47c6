"""Lab servers that are full virtual machines: qemu with their own Debian 12 kernel, for what a
container cannot show (md arrays, reboots through the boot loader, the kernel command line).

Each VM is a qcow2 copy-on-write overlay of one cached disk image (image.py), with N virtual
NVMe drives of stable serials, reachable only at 127.0.0.1:PORT (user-mode networking with one
port forward to the guest's sshd). Its name, ssh host key and root's authorized key reach the
guest through qemu's firmware configuration (fw_cfg), read by a unit baked into the image.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner import paths
from provisioner.errors import ExitCode
from provisioner.system import run

from .common import LabError

QEMU = "qemu-system-x86_64"
QEMU_IMG = "qemu-img"
# Which Debian package brings each tool the VM lab needs on this machine.
VM_TOOLS = {
    QEMU: "qemu-system-x86",
    QEMU_IMG: "qemu-utils",
    "mmdebstrap": "mmdebstrap",
    "sfdisk": "fdisk",
    "mkfs.ext4": "e2fsprogs",
    "ssh-keygen": "openssh-client",
}
VM_PACKAGES = ("qemu-system-x86", "qemu-utils", "mmdebstrap", "fdisk", "e2fsprogs", "openssh-client")

CPUS = 2
# 1 GiB hugepages reserved from the kernel command line need 4 GiB: with 3 GiB the kernel
# could not allocate even one.
MEMORY_MB = 4096
# Each NVMe drive is a PCI device on the VM's one PCI bus (32 slots, some taken by the board,
# the boot disk, the network card and the entropy source); the lab takes at most this many.
MAX_DRIVES = 8
DEFAULT_DRIVE_SIZE = "4G"
# Software emulation boots to ssh in 45-70 s here and about 3x slower under load.
BOOT_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 10.0
CONSOLE_TAIL_LINES = 6
CONSOLE_LINE_CHARS = 160
SERIAL_PREFIX = "DATA"
# What the guest sees for a drive with serial S (udev's by-id name of a qemu NVMe controller).
BY_ID_PREFIX = "/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_"
FW_CFG_PREFIX = "opt/provisioner/"

_SIZE_RE = re.compile(r"(?i)\s*(\d+)\s*([kmgt]?)(i?b?)\s*")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def missing_vm_requirement() -> str | None:
    """What this machine lacks for VM lab servers (one line naming the packages), or None."""
    missing = [tool for tool in VM_TOOLS if shutil.which(tool) is None]
    if not missing:
        return None
    packages = sorted({VM_TOOLS[t] for t in missing})
    return f"lab VMs need {', '.join(missing)}: apt-get install {' '.join(packages)}"


def check_vm_environment() -> None:
    problem = missing_vm_requirement()
    if problem:
        raise LabError(problem)


def parse_size(text: str) -> int:
    """Bytes in a size such as 4G, 512M, 1T, 10GiB (binary units); LabError otherwise."""
    match = _SIZE_RE.fullmatch(str(text))
    if not match or int(match.group(1)) == 0:
        raise LabError(f"bad drive size {text!r}: give a positive size such as 4G, 512M or 1T", ExitCode.BAD_INPUT)
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


@dataclass(frozen=True)
class Drive:
    """One virtual NVMe drive: its image on this machine and its stable name in the guest."""

    image: Path
    serial: str
    size: int

    @property
    def by_id(self) -> str:
        return BY_ID_PREFIX + self.serial


def plan_drives(root: Path, count: int, size: str, free_bytes: int) -> list[Drive]:
    """COUNT drives of SIZE each under ROOT, refused (LabError) when the lab cannot hold them.

    The images are sparse, but a test that fills them must not fill this machine's disk: their
    full size together has to fit in FREE_BYTES.
    """
    if count < 0 or count > MAX_DRIVES:
        raise LabError(
            f"--drives {count}: a lab VM takes 0 to {MAX_DRIVES} NVMe drives (each is a PCI device); ask for fewer",
            ExitCode.BAD_INPUT,
        )
    each = parse_size(size)
    if count and each * count > free_bytes:
        raise LabError(
            f"{count} drives of {size} need {_gib(each * count)} but {paths.lab_dir()} has {_gib(free_bytes)} free: "
            "use a smaller --drive-size or fewer --drives",
            ExitCode.BAD_INPUT,
        )
    return [Drive(root / f"nvme{i}.qcow2", f"{SERIAL_PREFIX}{i}", each) for i in range(count)]


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def check_memory(meminfo: str, memory_mb: int = MEMORY_MB) -> None:
    """Refuse a VM this machine has no memory for (MemAvailable from /proc/meminfo)."""
    match = re.search(r"(?m)^MemAvailable:\s+(\d+) kB", meminfo)
    if match and int(match.group(1)) // 1024 < memory_mb:
        raise LabError(
            f"a lab VM needs {memory_mb} MiB of memory but {int(match.group(1)) // 1024} MiB are available: "
            "take other lab servers down first"
        )


KERNEL_BANNER = b"Linux version"  # a kernel's first line on the serial port


def kvm_works(probe_timeout: float = 20.0, kernel: Path | None = None) -> bool:
    """Whether hardware virtualization really runs a guest here (not only whether /dev/kvm exists).

    Some hosts offer /dev/kvm whose vCPUs cannot be set up (qemu aborts setting an MSR with
    -cpu host), and some (a nested VM seen here) run the firmware but hang a Linux kernel as it
    leaves real mode. With KERNEL (the guest's own) the probe boots it with no disk and must see
    its first line ("Linux version", early printk on the serial port) before the kernel panics
    for want of a root and qemu exits; without one, qemu must still run the firmware at the
    timeout (SeaBIOS waits for a boot device). Anything else means software emulation.
    """
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    cmd = [QEMU, "-accel", "kvm", "-cpu", "host", "-m", "256" if kernel else "64", "-nodefaults", "-no-user-config"]
    cmd += ["-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot"]
    if kernel:
        cmd += ["-kernel", str(kernel), "-append", "earlyprintk=serial,ttyS0,115200 console=ttyS0,115200 panic=-1"]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except OSError:
        return False
    try:
        out, _ = proc.communicate(timeout=probe_timeout)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        rest, _ = proc.communicate()
        return KERNEL_BANNER in (exc.output or b"") + (rest or b"") if kernel else True
    return bool(kernel) and KERNEL_BANNER in (out or b"")


def accelerator(kernel: Path | None = None) -> str:
    """kvm or tcg: $PROVISIONER_LAB_ACCEL when set, else what was found to work (remembered per
    qemu binary). Given the guest's KERNEL, a verdict of the firmware-only probe is probed again
    by booting it."""
    forced = os.environ.get("PROVISIONER_LAB_ACCEL", "")
    if forced in ("kvm", "tcg"):
        return forced
    qemu = shutil.which(QEMU) or QEMU
    with contextlib.suppress(OSError):
        stamp = f"{qemu}:{os.stat(qemu).st_mtime_ns}"
        cache = paths.lab_dir() / "vm-accel"
        with contextlib.suppress(OSError, ValueError):
            fields = cache.read_text().split()
            known, how, accel = fields if len(fields) == 3 else (*fields[:1], "firmware", *fields[1:2])
            if known == stamp and accel in ("kvm", "tcg") and (how == "kernel" or kernel is None or accel == "tcg"):
                return accel
        accel = "kvm" if kvm_works(kernel=kernel) else "tcg"
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(f"{stamp} {'kernel' if kernel else 'firmware'} {accel}\n")
        return accel
    return "tcg"


def accel_args(accel: str) -> list[str]:
    if accel == "kvm":
        return ["-accel", "kvm", "-cpu", "host"]
    return ["-accel", "tcg,thread=multi", "-cpu", "max"]


def qemu_cmd(
    name: str,
    disk: Path,
    console: Path,
    port: int,
    drives: Sequence[Drive],
    accel: str,
    fw_cfg: dict[str, str],
    *,
    kernel: tuple[Path, Path, str] | None = None,
) -> list[str]:
    """The qemu command line of lab VM NAME.

    FW_CFG maps names under opt/provisioner/ to files; KERNEL (vmlinuz, initrd, command line)
    boots a kernel directly (only the image build does: every server boots through grub).
    """
    cmd = [QEMU, "-name", name, "-nodefaults", "-no-user-config", *accel_args(accel)]
    cmd += ["-smp", str(CPUS), "-m", str(MEMORY_MB)]
    cmd += ["-display", "none", "-monitor", "none", "-serial", f"file:{console}"]
    if kernel is None:
        # A server's control socket (QMP) beside its console: drives go out and come back through it.
        cmd += ["-qmp", f"unix:{qmp_socket(console.parent)},server=on,wait=off"]
    cmd += ["-drive", f"file={disk},if=virtio,format=qcow2,cache=unsafe,discard=unmap"]
    # User-mode networking: the guest reaches out through this machine; the only way in is
    # the forward of 127.0.0.1:PORT to its sshd.
    cmd += ["-netdev", f"user,id=net0,hostfwd=tcp:127.0.0.1:{port}-:22"]
    cmd += ["-device", "virtio-net-pci,netdev=net0", "-device", "virtio-rng-pci"]
    for i, drive in enumerate(drives):
        cmd += ["-drive", f"file={drive.image},if=none,id={_node(i)},format=qcow2,cache=unsafe,discard=unmap"]
        cmd += ["-device", f"nvme,serial={drive.serial},drive={_node(i)},id={_device(i)}"]
    for key, path in sorted(fw_cfg.items()):
        cmd += ["-fw_cfg", f"name={FW_CFG_PREFIX}{key},file={path}"]
    if kernel is not None:
        vmlinuz, initrd, append = kernel
        cmd += ["-kernel", str(vmlinuz), "-initrd", str(initrd), "-append", append]
    return cmd


def free_port(used: Sequence[int] = ()) -> int:
    """A TCP port free on 127.0.0.1 and not held by another lab VM's state."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in used:
            return port
    raise LabError("no free TCP port on 127.0.0.1 for the lab VM's ssh forward: free some ports and retry")


def create_disk(base: Path, disk: Path) -> None:
    """DISK: a qcow2 overlay over the cached image BASE (the image itself is never written)."""
    run(
        [QEMU_IMG, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(base), str(disk)],
        f"creating the VM disk {disk} failed",
        error=LabError,
    )


def create_drives(drives: Sequence[Drive]) -> None:
    for drive in drives:
        run(
            [QEMU_IMG, "create", "-q", "-f", "qcow2", str(drive.image), str(drive.size)],
            f"creating the NVMe drive image {drive.image} failed",
            error=LabError,
        )


def spawn(cmd: Sequence[str], console: Path, log: Path) -> subprocess.Popen[bytes]:
    """Start qemu in a session of its own (its serial console to CONSOLE, its own messages to LOG)."""
    console.touch()
    with open(log, "ab") as out:
        try:
            return subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise LabError(f"cannot start {cmd[0]} ({exc}): apt-get install qemu-system-x86") from exc


_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def remember(proc: subprocess.Popen[bytes]) -> int:
    _CHILDREN[proc.pid] = proc
    return proc.pid


def is_qemu_argv(argv: Sequence[bytes], name: str) -> bool:
    """True if a /proc/PID/cmdline split at NULs is qemu running lab VM NAME."""
    if not argv or os.path.basename(argv[0]) != QEMU.encode():
        return False
    return any(a == b"-name" and b == name.encode() for a, b in itertools.pairwise(argv))


def is_our_qemu(pid: int, name: str) -> bool:
    """True if PID is a running (not zombie) qemu of lab VM NAME."""
    if pid <= 0:
        return False
    proc = _CHILDREN.get(pid)
    if proc is not None:
        # Our own child: its exit status says it, not /proc (whose cmdline can read empty
        # while the process is still setting up right after exec).
        if proc.poll() is None:
            return True
        del _CHILDREN[pid]
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
        return False
    return is_qemu_argv(argv, name)


def console_tail(console: Path, lines: int = CONSOLE_TAIL_LINES) -> str:
    """The last LINES non-empty lines of a serial console log, joined for a one-line error."""
    try:
        text = console.read_bytes().decode(errors="replace")
    except OSError:
        return "(no console output)"
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][0-9A-Za-z]|\r", "", text)
    # Boot loader menus draw with spaces and box lines: squeeze them, cut very long lines.
    squeezed = (re.sub(r"\s{2,}|[-+|]{3,}", " ", line).strip()[:CONSOLE_LINE_CHARS] for line in text.splitlines())
    kept = [line for line in squeezed if line][-lines:]
    return " | ".join(kept) if kept else "(no console output)"


def ssh_banner(port: int, timeout: float = 3.0) -> bool:
    """True if something sends an ssh banner on 127.0.0.1:PORT (the guest's sshd, not the forward alone)."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        return sock.recv(64).startswith(b"SSH-")
    return False


def wait_ssh(name: str, pid: int, port: int, console: Path, timeout: float) -> None:
    """Until the guest's sshd answers through the forward, at most TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_our_qemu(pid, name):
            qemu_said = console_tail(console.with_name("qemu.log"), 2)
            raise LabError(f"lab VM {name} stopped while booting; qemu said: {qemu_said}; console: {console_tail(console)}")
        if ssh_banner(port):
            return
        time.sleep(1.0)
    raise LabError(
        f"lab VM {name} did not answer ssh on 127.0.0.1:{port} within {timeout:.0f} s; it was stopped and removed; "
        f"console: {console_tail(console)}"
    )


def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The exit code of PROC within TIMEOUT seconds, None if it still runs."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def stop(pid: int, name: str) -> None:
    """Power the VM off at once (SIGTERM: qemu exits as if the power were cut), SIGKILL if it lingers.

    Nothing of a lab VM is kept, so there is no guest shutdown to wait for.
    """
    if not is_our_qemu(pid, name):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        if not is_our_qemu(pid, name):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if not is_our_qemu(pid, name):
            return
        time.sleep(0.1)
    raise LabError(f"qemu PID {pid} of lab VM {name} survived SIGKILL: kill it by hand")


# --------------------------------------------------------------------------- drives out and back

QMP_SOCKET = "qmp.sock"
# Unplugging waits for the guest to let go of the device (ACPI hotplug), slow under emulation.
UNPLUG_TIMEOUT_S = 120.0
QMP_TIMEOUT_S = 30.0


def qmp_socket(root: Path) -> Path:
    return root / QMP_SOCKET


def _node(index: int) -> str:
    """The block node of drive INDEX (its image), which stays while the drive is out."""
    return f"nvme{index}"


def _device(index: int) -> str:
    """The NVMe controller of drive INDEX as qemu names it (what goes out and comes back)."""
    return f"nvmedev{index}"


class Qmp:
    """A QMP connection to one lab VM's qemu: commands, and the events that arrive meanwhile."""

    def __init__(self, path: Path, timeout: float = QMP_TIMEOUT_S) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._buffer = b""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(str(path))
        except OSError as exc:
            self._sock.close()
            raise LabError(
                f"cannot reach the control socket {path} of the lab VM ({exc}): is it running? "
                "(a VM booted before drives could go out has none: take it down and up again)"
            ) from exc
        self._read()  # the greeting
        self.command("qmp_capabilities")

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Qmp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            try:
                chunk = self._sock.recv(65536)
            except OSError as exc:
                raise LabError(f"the lab VM's control socket {self.path} did not answer ({exc})") from exc
            if not chunk:
                raise LabError(f"the lab VM's control socket {self.path} closed (did qemu stop?)")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    def command(self, name: str, **arguments: Any) -> Any:
        """The return value of command NAME; LabError with qemu's own words on an error."""
        request: dict[str, Any] = {"execute": name}
        if arguments:
            request["arguments"] = arguments
        self._sock.sendall(json.dumps(request).encode() + b"\n")
        while True:
            message = self._read()
            if "event" in message:
                self.events.append(message)
                continue
            if "error" in message:
                raise LabError(f"qemu refused {name}: {message['error'].get('desc', message['error'])}")
            return message.get("return")

    def wait_event(self, event: str, timeout: float, **data: Any) -> bool:
        """Whether event EVENT (with DATA among its data) came, waiting at most TIMEOUT seconds."""
        deadline = time.monotonic() + timeout
        while True:
            for i, message in enumerate(self.events):
                if message.get("event") == event and all(message.get("data", {}).get(k) == v for k, v in data.items()):
                    del self.events[: i + 1]
                    return True
            self.events.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._sock.settimeout(left)
            try:
                message = self._read()
            except LabError:
                if time.monotonic() >= deadline:
                    return False
                raise
            finally:
                self._sock.settimeout(QMP_TIMEOUT_S)
            if "event" in message:
                self.events.append(message)


def _plugged(qmp: Qmp) -> set[str]:
    """The ids of the user-created devices qemu has now (QOM /machine/peripheral)."""
    return {str(entry["name"]) for entry in qmp.command("qom-list", path="/machine/peripheral") or []}


def _nodes(qmp: Qmp) -> set[str]:
    return {str(n.get("node-name")) for n in qmp.command("query-named-block-nodes") or []} | {
        str(b.get("device")) for b in qmp.command("query-block") or [] if b.get("device")
    }


def drive_present(root: Path, index: int) -> bool:
    """Whether drive INDEX of the lab VM in ROOT is plugged in now."""
    with Qmp(qmp_socket(root)) as qmp:
        return _device(index) in _plugged(qmp)


def remove_drive(root: Path, index: int, timeout: float = UNPLUG_TIMEOUT_S) -> bool:
    """Pull drive INDEX out of the running lab VM in ROOT, as a drive that fails or is taken out.

    Its image stays as it is (qemu keeps it open) for return_drive. False if it was out already;
    LabError if the guest did not let go of it within TIMEOUT seconds.
    """
    with Qmp(qmp_socket(root)) as qmp:
        if _device(index) not in _plugged(qmp):
            return False
        qmp.command("device_del", id=_device(index))
        if not qmp.wait_event("DEVICE_DELETED", timeout, device=_device(index)):
            raise LabError(
                f"the lab VM did not let go of drive {index} within {timeout:.0f} s (qemu asked it to eject the "
                "NVMe controller): retry, or take the VM down"
            )
        return True


def return_drive(root: Path, drive: Drive, index: int) -> bool:
    """Put drive INDEX back into the running lab VM in ROOT: the same image and serial, so the
    guest sees the same /dev/disk/by-id name (its kernel name may differ). False if it was in."""
    with Qmp(qmp_socket(root)) as qmp:
        if _device(index) in _plugged(qmp):
            return False
        if _node(index) not in _nodes(qmp):
            # A drive given with -drive went away with its controller: open the image again.
            qmp.command(
                "blockdev-add",
                **{
                    "node-name": _node(index),
                    "driver": "qcow2",
                    "discard": "unmap",
                    "cache": {"direct": False, "no-flush": True},
                    "file": {"driver": "file", "filename": str(drive.image)},
                },
            )
        qmp.command("device_add", driver="nvme", serial=drive.serial, drive=_node(index), id=_device(index))
        return True
