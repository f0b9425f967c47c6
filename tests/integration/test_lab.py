"""Lab servers: boot, ssh with strict host keys, idempotence, apt, teardown."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioner import lab, paths
from provisioner.lab import processes

pytestmark = pytest.mark.lab
# Every test here needs lab servers: skip (or, under the test script, fail) naming what is missing.
needs_lab = pytest.mark.usefixtures("lab_requirements")


def ssh(server: lab.LabServer, command: str, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-F", str(server.ssh_config), *extra, server.name, command],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def nat_rule_present() -> bool:
    out = subprocess.run(
        ["iptables", "-w", "-t", "nat", "-S", "POSTROUTING"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sum(lab.NAT_COMMENT in line and "MASQUERADE" in line for line in out.splitlines()) == 1


def host_lab_subnets() -> set[str]:
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"inet (10\.213\.\d+)\.1/24", out))


def ip_forward() -> str:
    return Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()


def mounted(path: Path) -> bool:
    return any(line.split()[4] == str(path) for line in Path("/proc/self/mountinfo").read_text().splitlines())


def process_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.fixture
def loop_device(tmp_path: Path):
    image = tmp_path / "disk.img"
    with open(image, "wb") as handle:
        handle.truncate(64 * 1024 * 1024)
    dev = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, text=True, check=True).stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


@pytest.mark.parametrize("name", ["", "Upper", "1abc", "a_b", "a.b", "a" * 32, "-x", "a b"])
def test_bad_name_raises(name: str) -> None:
    with pytest.raises(lab.LabError, match="bad lab server name"):
        lab.up(name)
    with pytest.raises(lab.LabError, match="bad lab server name"):
        lab.down(name)


# Runs first on purpose: when no other lab server is live, it also proves that the last
# down removes the NAT rule and restores ip_forward.
@needs_lab
def test_down_removes_everything(fresh_lab_server, loop_device: str) -> None:
    others_before = host_lab_subnets()
    forward_before = ip_forward()
    server = fresh_lab_server("pv-test-down", devices=[loop_device])
    assert server.devices == [loop_device]
    assert ssh(server, f"dd if={loop_device} of=/dev/null bs=4096 count=1").returncode == 0, "bound device missing"
    assert nat_rule_present() and ip_forward() == "1"
    merged = server.root / "merged"
    assert mounted(merged) and Path(f"/sys/class/net/{server.host_veth}").exists()

    assert lab.down(server.name) is True

    assert not process_alive(server.pid) and not process_alive(server.leader_pid)
    assert not mounted(merged)
    assert not Path(f"/sys/class/net/{server.host_veth}").exists()
    assert not server.root.exists()
    assert server.name not in [s.name for s in lab.list_servers()]
    assert lab.down(server.name) is False  # harmless when it does not exist
    # Its files were moved aside and are deleted in the background, soon.
    from provisioner.lab.server import discarded_dir

    deadline = time.monotonic() + 120
    while any(p.name.startswith(f"{server.name}-") for p in discarded_dir().iterdir()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in discarded_dir().iterdir() if p.name.startswith(f"{server.name}-")]
    # Other tests may start servers meanwhile (the suite runs on two workers): look at the
    # servers alive now, with the lab locked so none comes or goes while we look.
    with lab.frozen():
        others_now = [s for s in lab.list_servers() if s.alive]
        nat_now, forward_now = nat_rule_present(), ip_forward()
    if others_now:
        assert nat_now, "NAT rule removed while other lab servers are live"
    else:
        assert not nat_now, "NAT rule left behind by the last lab server"
        if not others_before:
            assert forward_now == forward_before


@needs_lab
def test_failed_up_cleans_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "SSH_TIMEOUT_S", 0.0)
    with pytest.raises(lab.LabError, match=re.escape("pv-test-fail.failed-console.log")):
        lab.up("pv-test-fail")
    kept = paths.lab_dir() / "pv-test-fail.failed-console.log"
    assert "Spawning container pv-test-fail" in kept.read_text()
    assert not (paths.lab_dir() / "pv-test-fail").exists()
    assert not any(s.name == "pv-test-fail" for s in lab.list_servers())
    out = subprocess.run(["pgrep", "-f", "--machine=pv-test-fail"], capture_output=True, text=True)
    assert out.stdout.strip() == ""
    lab.down("pv-test-fail")
    assert not kept.exists()


@needs_lab
def test_stale_server_is_recreated(fresh_lab_server) -> None:
    first = fresh_lab_server("pv-test-stale")
    os.killpg(first.pid, signal.SIGKILL)
    os.kill(first.leader_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(s.alive for s in lab.list_servers() if s.name == first.name):
        time.sleep(0.05)
    assert [s.alive for s in lab.list_servers() if s.name == first.name] == [False]

    second = fresh_lab_server("pv-test-stale")
    assert second.alive and second.pid != first.pid
    assert ssh(second, "true").returncode == 0


@needs_lab
def test_ssh_works_with_strict_host_key(lab_server: lab.LabServer, tmp_path: Path) -> None:
    ok = ssh(lab_server, "true")
    assert ok.returncode == 0, ok.stderr
    known = lab_server.known_hosts.read_text().split()
    assert known[0] == lab_server.address and len(lab_server.known_hosts.read_text().splitlines()) == 1

    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{lab_server.address} {Path(str(other) + '.pub').read_text()}")
    bad = ssh(lab_server, "true", "-o", f"UserKnownHostsFile={wrong}", "-o", "LogLevel=ERROR")
    assert bad.returncode == 255
    assert "host key" in bad.stderr.lower() or "identification has changed" in bad.stderr.lower()


@needs_lab
def test_up_is_idempotent(lab_server: lab.LabServer) -> None:
    again = lab.up(lab_server.name)
    assert (again.pid, again.leader_pid, again.address) == (
        lab_server.pid,
        lab_server.leader_pid,
        lab_server.address,
    )


@needs_lab
def test_system_is_running(lab_server: lab.LabServer) -> None:
    out = ssh(lab_server, "systemctl is-system-running --wait")
    assert out.stdout.strip() in ("running", "degraded"), out.stdout + out.stderr


@needs_lab
def test_apt_update_works(lab_server: lab.LabServer) -> None:
    out = ssh(lab_server, "apt-get update -q", timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Err:" not in out.stdout and "W:" not in out.stderr, out.stdout + out.stderr


@needs_lab
def test_list_shows_server(lab_server: lab.LabServer) -> None:
    listed = {s.name: s for s in lab.list_servers()}
    assert lab_server.name in listed and listed[lab_server.name].alive
    data = json.loads(json.dumps(listed[lab_server.name].to_dict()))
    assert data["address"] == lab_server.address and data["pid"] == lab_server.pid
    for path in (
        lab_server.ssh_key,
        lab_server.known_hosts,
        lab_server.inventory,
        lab_server.ssh_config,
    ):
        assert path.is_file()


@needs_lab
def test_inventory_works_with_ansible(lab_server: lab.LabServer) -> None:
    ansible = Path(sys.executable).parent / "ansible"
    out = subprocess.run(
        [str(ansible), "-i", str(lab_server.inventory), "lab", "-m", "ping"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={
            **os.environ,
            "ANSIBLE_HOST_KEY_CHECKING": "True",
            "PATH": f"{ansible.parent}:{os.environ['PATH']}",
        },
    )
    assert out.returncode == 0 and "pong" in out.stdout, out.stdout + out.stderr
