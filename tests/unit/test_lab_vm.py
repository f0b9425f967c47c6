"""provisioner.lab's VM servers, the parts that decide without booting anything: the qemu command
line, the drives and their refusals, sizes, memory, the accelerator, the client files of a
forwarded port, the image recipe, and the CLI's refusals (no qemu runs here)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provisioner import lab
from provisioner.errors import ExitCode
from provisioner.lab import image, server, ssh, state, vm

BIN = Path(sys.executable).parent / "provisioner"


@pytest.fixture
def lab_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "lab"
    monkeypatch.setenv("PROVISIONER_LAB_DIR", str(path))
    return path


# --------------------------------------------------------------------------- sizes and drives


@pytest.mark.parametrize(
    ("text", "size"),
    [("4G", 4 << 30), ("512M", 512 << 20), ("1T", 1 << 40), ("10GiB", 10 << 30), ("2g", 2 << 30), ("4096", 4096)],
)
def test_sizes_are_binary_units(text: str, size: int) -> None:
    assert vm.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "0", "0G", "-1G", "4X", "1.5G", "G", "4 G B"])
def test_a_bad_size_is_bad_input_naming_the_form(text: str) -> None:
    with pytest.raises(lab.LabError, match=r"bad drive size .*give a positive size such as 4G") as exc:
        vm.parse_size(text)
    assert exc.value.exit_code == ExitCode.BAD_INPUT


def test_drives_get_stable_serials_and_their_by_id_names(tmp_path: Path) -> None:
    drives = vm.plan_drives(tmp_path, 2, "1G", free_bytes=100 << 30)
    assert [d.serial for d in drives] == ["DATA0", "DATA1"]
    assert [d.by_id for d in drives] == [
        "/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_DATA0",
        "/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_DATA1",
    ]
    assert [d.image for d in drives] == [tmp_path / "nvme0.qcow2", tmp_path / "nvme1.qcow2"]
    assert {d.size for d in drives} == {1 << 30}
    assert vm.plan_drives(tmp_path, 0, "1G", free_bytes=0) == []


@pytest.mark.parametrize("count", [-1, vm.MAX_DRIVES + 1, 100])
def test_more_drives_than_a_vm_takes_are_refused(tmp_path: Path, count: int) -> None:
    with pytest.raises(lab.LabError, match=rf"--drives {count}: a lab VM takes 0 to {vm.MAX_DRIVES} NVMe drives") as exc:
        vm.plan_drives(tmp_path, count, "1G", free_bytes=1 << 50)
    assert exc.value.exit_code == ExitCode.BAD_INPUT


def test_drives_larger_than_the_free_disk_are_refused_with_both_figures(tmp_path: Path) -> None:
    with pytest.raises(lab.LabError, match=r"2 drives of 6G need 12.0 GiB but .* has 10.0 GiB free: use a smaller") as exc:
        vm.plan_drives(tmp_path, 2, "6G", free_bytes=10 << 30)
    assert exc.value.exit_code == ExitCode.BAD_INPUT
    assert len(vm.plan_drives(tmp_path, 2, "5G", free_bytes=10 << 30)) == 2


def test_a_vm_needs_its_memory_available() -> None:
    vm.check_memory("MemTotal: 24000000 kB\nMemAvailable:   8000000 kB\n")
    with pytest.raises(lab.LabError, match=r"a lab VM needs 4096 MiB of memory but 2929 MiB are available"):
        vm.check_memory("MemAvailable:   3000000 kB\n")


def test_up_vm_refuses_before_anything_starts(lab_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad drives stop up_vm before the image is built, a port taken or a process started."""
    monkeypatch.setattr(server, "check_environment", lambda: None)
    monkeypatch.setattr(vm, "check_vm_environment", lambda: None)

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("started something for a refused VM")

    for name in ("ensure_image", "_create_vm"):
        monkeypatch.setattr(server, name, must_not_run)
    monkeypatch.setattr(vm, "accelerator", lambda: "tcg")
    with pytest.raises(lab.LabError, match="a lab VM takes 0 to"):
        server.up_vm("vm-unit", drives=vm.MAX_DRIVES + 1)
    with pytest.raises(lab.LabError, match="GiB free: use a smaller --drive-size"):
        server.up_vm("vm-unit", drives=2, drive_size="1000000T")
    assert not (lab_dir / "vm-unit").exists()


def test_qemu_missing_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vm.shutil, "which", lambda tool: None if tool in (vm.QEMU, vm.QEMU_IMG) else f"/usr/bin/{tool}")
    assert vm.missing_vm_requirement() == (
        "lab VMs need qemu-system-x86_64, qemu-img: apt-get install qemu-system-x86 qemu-utils"
    )
    with pytest.raises(lab.LabError, match="apt-get install qemu-system-x86 qemu-utils"):
        vm.check_vm_environment()
    monkeypatch.setattr(vm.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    assert lab.missing_vm_requirement() is None


def test_install_sh_installs_what_the_vm_lab_needs() -> None:
    """The test install brings every package the VM lab asks for, so a fresh clone's CI has them."""
    text = (Path(__file__).resolve().parents[2] / "install.sh").read_text()
    test_line = next(line for line in text.splitlines() if "qemu-system-x86" in line)
    assert test_line.startswith('[ "$test" = 1 ]')
    installed = set(re.findall(r"[a-z0-9][a-z0-9.+-]*", text))
    assert set(vm.VM_PACKAGES) <= installed, set(vm.VM_PACKAGES) - installed
    assert set(vm.VM_TOOLS.values()) == set(vm.VM_PACKAGES)


# --------------------------------------------------------------------------- qemu command line


def _cmd(tmp_path: Path, accel: str = "tcg", drives: int = 2, **kwargs: object) -> list[str]:
    planned = vm.plan_drives(tmp_path, drives, "1G", free_bytes=1 << 40)
    fw = {"hostname": str(tmp_path / "seed" / "hostname"), "host_key": str(tmp_path / "seed" / "key")}
    return vm.qemu_cmd("vm-unit", tmp_path / "disk.qcow2", tmp_path / "console.log", 40022, planned, accel, fw, **kwargs)  # type: ignore[arg-type]


def _after(cmd: list[str], flag: str) -> list[str]:
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == flag]


def test_software_emulation_uses_every_host_thread_and_the_widest_cpu(tmp_path: Path) -> None:
    cmd = _cmd(tmp_path)
    assert cmd[0] == "qemu-system-x86_64" and _after(cmd, "-name") == ["vm-unit"]
    assert _after(cmd, "-accel") == ["tcg,thread=multi"] and _after(cmd, "-cpu") == ["max"]
    assert _after(cmd, "-smp") == [str(vm.CPUS)] and _after(cmd, "-m") == ["4096"]
    kvm = _cmd(tmp_path, accel="kvm")
    assert _after(kvm, "-accel") == ["kvm"] and _after(kvm, "-cpu") == ["host"]


def test_ssh_is_forwarded_from_loopback_only(tmp_path: Path) -> None:
    cmd = _cmd(tmp_path)
    assert _after(cmd, "-netdev") == ["user,id=net0,hostfwd=tcp:127.0.0.1:40022-:22"]
    assert "-nodefaults" in cmd  # no default network card or anything else beyond what is listed
    assert _after(cmd, "-serial") == [f"file:{tmp_path / 'console.log'}"]
    assert _after(cmd, "-display") == ["none"] and _after(cmd, "-monitor") == ["none"]


def test_each_drive_is_an_nvme_controller_with_its_serial(tmp_path: Path) -> None:
    cmd = _cmd(tmp_path)
    drives = _after(cmd, "-drive")
    assert drives[0] == f"file={tmp_path / 'disk.qcow2'},if=virtio,format=qcow2,cache=unsafe,discard=unmap"
    assert drives[1:] == [
        f"file={tmp_path / f'nvme{i}.qcow2'},if=none,id=nvme{i},format=qcow2,cache=unsafe,discard=unmap" for i in (0, 1)
    ]
    assert [d for d in _after(cmd, "-device") if d.startswith("nvme")] == [
        "nvme,serial=DATA0,drive=nvme0,id=nvmedev0",
        "nvme,serial=DATA1,drive=nvme1,id=nvmedev1",
    ]
    assert not any(d.startswith("nvme") for d in _after(_cmd(tmp_path, drives=0), "-device"))


def test_the_seed_goes_through_fw_cfg_and_only_the_build_boots_a_kernel_directly(tmp_path: Path) -> None:
    cmd = _cmd(tmp_path)
    assert _after(cmd, "-fw_cfg") == [
        f"name=opt/provisioner/host_key,file={tmp_path / 'seed' / 'key'}",
        f"name=opt/provisioner/hostname,file={tmp_path / 'seed' / 'hostname'}",
    ]
    assert "-kernel" not in cmd  # a lab VM boots through grub on its disk
    built = _cmd(tmp_path, kernel=(Path("/b/vmlinuz"), Path("/b/initrd"), "root=/dev/vda1"))
    assert (_after(built, "-kernel"), _after(built, "-initrd"), _after(built, "-append")) == (
        ["/b/vmlinuz"],
        ["/b/initrd"],
        ["root=/dev/vda1"],
    )


def test_a_qemu_is_recognised_by_program_and_vm_name() -> None:
    argv = [b"/usr/bin/qemu-system-x86_64", b"-name", b"vm-unit", b"-m", b"4096", b""]
    assert vm.is_qemu_argv(argv, "vm-unit")
    assert not vm.is_qemu_argv(argv, "vm-unit2")
    assert not vm.is_qemu_argv([b"/usr/bin/sleep", b"-name", b"vm-unit"], "vm-unit")
    assert not vm.is_qemu_argv([b"/usr/bin/qemu-system-x86_64", b"vm-unit"], "vm-unit")
    assert not vm.is_our_qemu(0, "vm-unit") and not vm.is_our_qemu(os.getpid(), "vm-unit")


def test_the_accelerator_can_be_forced_and_a_dead_kvm_means_tcg(lab_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISIONER_LAB_ACCEL", "kvm")
    assert vm.accelerator() == "kvm"
    monkeypatch.delenv("PROVISIONER_LAB_ACCEL")
    monkeypatch.setattr(vm, "kvm_works", lambda kernel=None: False)
    monkeypatch.setattr(vm.shutil, "which", lambda tool: sys.executable)
    assert vm.accelerator() == "tcg"
    monkeypatch.setattr(vm, "kvm_works", lambda kernel=None: True)
    assert vm.accelerator() == "tcg"  # remembered for this qemu binary
    (lab_dir / "vm-accel").unlink()
    assert vm.accelerator() == "kvm"
    # A firmware-only verdict of kvm is probed again with the guest's kernel (the firmware ran,
    # the kernel hangs); the kernel's verdict then stands, with or without a kernel.
    probed: list[Path | None] = []

    def kvm_works(kernel: Path | None = None) -> bool:
        probed.append(kernel)
        return False

    monkeypatch.setattr(vm, "kvm_works", kvm_works)
    assert vm.accelerator() == "kvm" and probed == []
    assert vm.accelerator(kernel=Path("/boot/vmlinuz")) == "tcg" and probed == [Path("/boot/vmlinuz")]
    assert vm.accelerator() == vm.accelerator(kernel=Path("/boot/vmlinuz")) == "tcg" and len(probed) == 1
    assert (lab_dir / "vm-accel").read_text().split()[1:] == ["kernel", "tcg"]


def test_the_kvm_probe_wants_the_kernels_first_line_not_only_a_running_qemu(tmp_path: Path, monkeypatch) -> None:
    """Stand-ins for qemu: firmware output then a hang (KVM that hangs the kernel), the kernel's
    banner then an exit (a kernel that panics for want of a root), and an immediate failure."""
    monkeypatch.setattr(vm.os, "access", lambda path, mode: True)
    kernel = tmp_path / "vmlinuz"
    kernel.write_bytes(b"kernel")

    def qemu(body: str) -> None:
        script = tmp_path / "qemu"
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
        monkeypatch.setattr(vm, "QEMU", str(script))

    qemu("echo 'Probing EDD (edd=off to disable)... ok'; exec sleep 30")
    assert vm.kvm_works(probe_timeout=1, kernel=kernel) is False  # the kernel never spoke
    assert vm.kvm_works(probe_timeout=1) is True  # without a kernel: the firmware still runs
    qemu("echo 'Linux version 6.1.0-57-amd64'; echo 'Kernel panic - not syncing: VFS'; exit 0")
    assert vm.kvm_works(probe_timeout=5, kernel=kernel) is True
    qemu("echo 'Linux version 6.1.0-57-amd64'; exec sleep 30")
    assert vm.kvm_works(probe_timeout=1, kernel=kernel) is True  # spoke, then still booting
    qemu("echo 'qemu: could not load kernel' >&2; exit 1")
    assert vm.kvm_works(probe_timeout=5, kernel=kernel) is False and vm.kvm_works(probe_timeout=5) is False


def test_an_empty_or_torn_accelerator_record_is_probed_again(lab_dir: Path, monkeypatch) -> None:
    monkeypatch.delenv("PROVISIONER_LAB_ACCEL", raising=False)
    monkeypatch.setattr(vm.shutil, "which", lambda tool: sys.executable)
    monkeypatch.setattr(vm, "kvm_works", lambda kernel=None: False)
    lab_dir.mkdir(parents=True, exist_ok=True)
    for text in ("", "only-one-field\n"):
        (lab_dir / "vm-accel").write_text(text)
        assert vm.accelerator() == "tcg"
        assert (lab_dir / "vm-accel").read_text().split()[1:] == ["firmware", "tcg"]


def test_the_console_tail_is_one_line_without_escapes(tmp_path: Path) -> None:
    console = tmp_path / "console.log"
    console.write_bytes(b"\x1b[2J\x1b[0mSeaBIOS\r\n\r\nBooting from Hard Disk...\r\n" + b"".join(b"l%d\n" % i for i in range(9)))
    assert vm.console_tail(console) == "l3 | l4 | l5 | l6 | l7 | l8"
    assert vm.console_tail(tmp_path / "none") == "(no console output)"


# --------------------------------------------------------------------------- state and client files


def test_a_vm_round_trips_through_its_state_and_a_container_keeps_its_defaults(lab_dir: Path) -> None:
    srv = lab.LabServer(
        name="vm-unit",
        address="127.0.0.1",
        pid=4321,
        leader_pid=0,
        root=lab_dir / "vm-unit",
        ssh_key=lab_dir / "id_ed25519",
        known_hosts=lab_dir / "vm-unit" / "known_hosts",
        inventory=lab_dir / "vm-unit" / "inventory.yml",
        ssh_config=lab_dir / "vm-unit" / "ssh_config",
        host_veth="",
        kind="vm",
        accel="tcg",
        port=40022,
        drives=["/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_DATA0"],
    )
    state.write_state("vm-unit", srv.to_dict())
    assert lab.LabServer.from_dict(state.read_state("vm-unit")) == srv
    listed = lab.list_servers()
    assert [(s.kind, s.accel, s.port, s.alive) for s in listed] == [("vm", "tcg", 40022, False)]
    old = lab.LabServer.from_dict({"name": "pv-old", "address": "10.213.3.2"})
    assert (old.kind, old.accel, old.port, old.drives) == ("container", "", 22, [])


def test_vm_states_take_no_lab_subnet(monkeypatch: pytest.MonkeyPatch) -> None:
    from provisioner.lab import network

    monkeypatch.setattr(network, "host_lab_indexes", set)
    assert network.allocate_index([{"name": "v", "kind": "vm", "address": "127.0.0.1"}]) == 1


def test_client_files_of_a_vm_name_its_forwarded_port(tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    ssh.write_client_files(tmp_path, "vm-unit", "127.0.0.1", key, ["ssh-ed25519", "AAAAC3Nza"], port=40022)
    assert (tmp_path / "known_hosts").read_text() == "[127.0.0.1]:40022 ssh-ed25519 AAAAC3Nza\n"
    host = yaml.safe_load((tmp_path / "inventory.yml").read_text())["all"]["children"]["lab"]["hosts"]["vm-unit"]
    assert (host["ansible_host"], host["ansible_port"]) == ("127.0.0.1", 40022)
    from provisioner import reboot

    assert not reboot.is_local("vm-unit", host)  # a VM may be rebooted, this machine never
    assert host["ansible_timeout"] >= 30  # an ssh login under emulation takes seconds
    config = (tmp_path / "ssh_config").read_text().splitlines()
    assert "  HostName 127.0.0.1" in config and "  Port 40022" in config
    # A VM's logins are each their own: a kept one would hang on the guest a reboot took away.
    assert "  ControlMaster no" in config and "  ControlPath none" in config
    ssh.write_client_files(tmp_path, "pv-unit", "10.213.5.2", key, ["ssh-ed25519", "AAAAC3Nza"])
    host = yaml.safe_load((tmp_path / "inventory.yml").read_text())["all"]["children"]["lab"]["hosts"]["pv-unit"]
    assert "ansible_port" not in host and "ansible_timeout" not in host
    assert not any(line.strip().startswith("Port") for line in (tmp_path / "ssh_config").read_text().splitlines())


# --------------------------------------------------------------------------- image recipe


def test_the_image_has_the_stock_kernel_grub_and_the_storage_tools() -> None:
    for package in ("linux-image-amd64", "grub-pc", "initramfs-tools", "openssh-server", "mdadm", "xfsprogs", "python3"):
        assert package in image.IMAGE_INCLUDE
    assert "MODULES=dep" in image.BAKED["etc/initramfs-tools/conf.d/provisioner-lab"][0]
    assert "console=ttyS0" in image.BAKED["etc/default/grub.d/50-provisioner-lab.cfg"][0]
    assert "grub-install --target=i386-pc /dev/vda" in image.SEED_SCRIPT
    assert "Before=ssh.service" in image.SEED_UNIT


def test_the_image_key_follows_the_recipe_and_the_host_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    key = image.image_key(["deb a bookworm main\n"], [])
    assert len(key) == 16 and image.image_key(["deb a bookworm main\n"], []) == key
    assert image.image_key(["deb b bookworm main\n"], []) != key
    monkeypatch.setattr(image, "IMAGE_INCLUDE", (*image.IMAGE_INCLUDE, "btrfs-progs"))
    assert image.image_key(["deb a bookworm main\n"], []) != key


def test_baking_drops_the_package_host_keys_and_enables_the_units(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "etc" / "ssh").mkdir(parents=True)
    (tree / "etc" / "ssh" / "ssh_host_rsa_key").write_text("shared")
    (tree / "etc" / "resolv.conf").symlink_to("/run/systemd/resolve/stub-resolv.conf")
    image._bake(tree, "0b6c1a4e-0000-4000-8000-000000000000")
    assert not list((tree / "etc" / "ssh").glob("ssh_host_*"))
    assert (tree / "etc" / "fstab").read_text() == "UUID=0b6c1a4e-0000-4000-8000-000000000000 / ext4 errors=remount-ro 0 1\n"
    assert (tree / "etc" / "resolv.conf").read_text() == "nameserver 10.0.2.3\n"
    wants = tree / "etc" / "systemd" / "system" / "multi-user.target.wants"
    assert os.readlink(wants / "provisioner-lab-seed.service") == "/etc/systemd/system/provisioner-lab-seed.service"
    assert os.readlink(wants / "ssh.service") == "/lib/systemd/system/ssh.service"
    for unit in ("apt-daily.timer", "e2scrub_reap.service", "e2scrub_all.timer"):
        assert os.readlink(tree / "etc" / "systemd" / "system" / unit) == "/dev/null", unit
    assert (tree / "usr" / "local" / "sbin" / "provisioner-lab-seed").stat().st_mode & 0o111


def test_the_seed_script_is_valid_shell() -> None:
    subprocess.run(["sh", "-n"], input=image.SEED_SCRIPT, text=True, check=True)


# --------------------------------------------------------------------------- the CLI


def _cli(*args: str) -> tuple[int, dict]:
    r = subprocess.run([str(BIN), "lab", *args, "--json"], capture_output=True, text=True, timeout=60)
    envelope = json.loads(r.stdout)
    assert envelope["exit_code"] == r.returncode
    return r.returncode, envelope


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("up", "vm-x", "--drives", "2"), "--drives, --drive-size and --boot-timeout are for lab VMs: add --vm"),
        (("up", "vm-x", "--vm", "--device", "/dev/loop0"), "--device is for container lab servers"),
        (("up", "vm-x", "--vm", "--boot-timeout", "0"), "--boot-timeout 0: give a positive number of seconds"),
        (("up", "vm-x", "--vm", "--cpu-weight", "1000"), "--cpu-weight is for container lab servers: leave out --vm"),
        (("up", "vm-x", "--cpu-weight", "0"), "--cpu-weight 0: give a weight from 1 to 10000"),
    ],
)
def test_the_cli_refuses_options_of_the_other_kind(args: tuple[str, ...], message: str) -> None:
    rc, envelope = _cli(*args)
    assert rc == ExitCode.BAD_INPUT and envelope["data"] is None
    assert len(envelope["errors"]) == 1 and message in envelope["errors"][0]
