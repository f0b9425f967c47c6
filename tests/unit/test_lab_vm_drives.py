"""A lab VM's drives taken out and put back through qemu's control socket (QMP), against a small
QMP server that speaks the protocol as qemu 7.2 does (greeting, capabilities, commands, events)."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner import lab
from provisioner.errors import ExitCode
from provisioner.lab import state, vm


class FakeQemu:
    """Devices and block nodes as qemu keeps them; device_del answers with DEVICE_DELETED (or not,
    for a guest that never lets go), and a -drive node goes away with its device, as qemu's do."""

    def __init__(self, path: Path, drives: int, *, ejects: bool = True) -> None:
        self.devices = {f"nvmedev{i}": f"nvme{i}" for i in range(drives)}
        self.nodes = {f"nvme{i}": "drive" for i in range(drives)}
        self.ejects = ejects
        self.log: list[dict[str, Any]] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn, conn.makefile("rwb") as f:
                f.write(b'{"QMP": {"version": {"qemu": {"major": 7, "minor": 2}}, "capabilities": []}}\n')
                f.flush()
                for line in f:
                    request = json.loads(line)
                    self.log.append(request)
                    for reply in self._answer(request["execute"], request.get("arguments", {})):
                        f.write(json.dumps(reply).encode() + b"\n")
                    f.flush()

    def _answer(self, name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
        if name == "qmp_capabilities":
            return [{"return": {}}]
        if name == "qom-list":
            return [{"return": [{"name": d, "type": "child<nvme>"} for d in self.devices] + [{"name": "type"}]}]
        if name == "query-named-block-nodes":
            return [{"return": [{"node-name": n} for n, kind in self.nodes.items() if kind == "node"]}]
        if name == "query-block":
            return [{"return": [{"device": n} for n, kind in self.nodes.items() if kind == "drive"]}]
        if name == "device_del":
            if args["id"] not in self.devices:
                return [{"error": {"class": "DeviceNotFound", "desc": f"Device '{args['id']}' not found"}}]
            replies: list[dict[str, Any]] = [{"event": "NVME_NOISE", "data": {}}, {"return": {}}]
            if self.ejects:
                node = self.devices.pop(args["id"])
                if self.nodes.get(node) == "drive":
                    del self.nodes[node]
                replies.append({"event": "DEVICE_DELETED", "data": {"device": args["id"], "path": "/x"}})
            return replies
        if name == "blockdev-add":
            if args["node-name"] in self.nodes:
                return [{"error": {"class": "GenericError", "desc": "Duplicate nodes with node-name"}}]
            self.nodes[args["node-name"]] = "node"
            return [{"return": {}}]
        if name == "device_add":
            if args["drive"] not in self.nodes:
                return [{"error": {"class": "GenericError", "desc": f"Drive '{args['drive']}' not found"}}]
            self.devices[args["id"]] = args["drive"]
            return [{"return": {}}]
        return [{"error": {"class": "CommandNotFound", "desc": f"The command {name} has not been found"}}]

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def qemu() -> Iterator[tuple[Path, FakeQemu]]:
    root = Path(tempfile.mkdtemp(prefix="qmp", dir="/tmp"))  # a short path: a socket's takes 107 bytes at most
    fake = FakeQemu(vm.qmp_socket(root), drives=3)
    yield root, fake
    fake.close()
    shutil.rmtree(root)


def test_the_vm_gets_a_control_socket_and_each_drive_an_id_to_unplug(tmp_path: Path) -> None:
    drives = vm.plan_drives(tmp_path, 2, "1G", free_bytes=1 << 40)
    cmd = vm.qemu_cmd("vm-unit", tmp_path / "disk.qcow2", tmp_path / "console.log", 40022, drives, "tcg", {})
    assert cmd[cmd.index("-qmp") + 1] == f"unix:{tmp_path / 'qmp.sock'},server=on,wait=off"
    assert "nvme,serial=DATA1,drive=nvme1,id=nvmedev1" in cmd
    build = vm.qemu_cmd("b", tmp_path / "d", tmp_path / "c", 1, [], "tcg", {}, kernel=(tmp_path, tmp_path, "x"))
    assert "-qmp" not in build  # the image build has no drives to pull


def test_a_drive_goes_out_and_comes_back_with_its_image_and_serial(qemu: tuple[Path, FakeQemu]) -> None:
    root, fake = qemu
    drive = vm.Drive(root / "nvme1.qcow2", "DATA1", 0)
    assert vm.drive_present(root, 1)
    assert vm.remove_drive(root, 1) is True
    assert not vm.drive_present(root, 1) and "nvmedev1" not in fake.devices and "nvme1" not in fake.nodes
    assert vm.remove_drive(root, 1) is False  # out already
    assert vm.return_drive(root, drive, 1) is True
    added = [r for r in fake.log if r["execute"] in ("blockdev-add", "device_add")]
    assert added == [
        {
            "execute": "blockdev-add",
            "arguments": {
                "node-name": "nvme1",
                "driver": "qcow2",
                "discard": "unmap",
                "cache": {"direct": False, "no-flush": True},
                "file": {"driver": "file", "filename": str(root / "nvme1.qcow2")},
            },
        },
        {"execute": "device_add", "arguments": {"driver": "nvme", "serial": "DATA1", "drive": "nvme1", "id": "nvmedev1"}},
    ]
    assert vm.return_drive(root, drive, 1) is False  # in already
    # Out and back again: the node opened by blockdev-add stays with qemu and is used again.
    fake.log.clear()
    assert vm.remove_drive(root, 1) and vm.return_drive(root, drive, 1)
    assert [r["execute"] for r in fake.log if r["execute"] in ("blockdev-add", "device_add")] == ["device_add"]


def test_a_guest_that_keeps_the_drive_is_an_error_naming_the_wait(qemu: tuple[Path, FakeQemu]) -> None:
    root, fake = qemu
    fake.ejects = False
    with pytest.raises(lab.LabError, match=r"did not let go of drive 2 within 1 s .*retry, or take the VM down"):
        vm.remove_drive(root, 2, timeout=1)


def test_a_refusal_of_qemu_is_one_line_with_its_words(qemu: tuple[Path, FakeQemu]) -> None:
    root, _ = qemu
    with vm.Qmp(vm.qmp_socket(root)) as qmp, pytest.raises(lab.LabError, match=r"qemu refused device_del: Device 'x' not found"):
        qmp.command("device_del", id="x")


def test_no_control_socket_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(lab.LabError, match=r"cannot reach the control socket .*take it down and up again"):
        vm.drive_present(tmp_path, 0)


def test_set_drive_refuses_what_is_not_a_running_vm_or_not_its_drive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISIONER_LAB_DIR", str(tmp_path / "lab"))
    with pytest.raises(lab.LabError, match=r"lab VM vmb-none is not running: start it with lab up vmb-none --vm") as exc:
        lab.set_drive("vmb-none", 0, present=False)
    assert exc.value.exit_code == ExitCode.BAD_INPUT
    state.write_state("vmb-two", {"name": "vmb-two", "kind": "vm", "pid": 1, "drives": ["a", "b"]})
    monkeypatch.setattr(state, "is_our_qemu", lambda pid, name: True)
    with pytest.raises(lab.LabError, match=r"lab VM vmb-two has 2 drive\(s\), numbered 0 to 1; there is no drive 2"):
        lab.set_drive("vmb-two", 2, present=True)
