"""First contact with a server over real SSH, on the shared lab server: facts and plan, one SSH
login per host, host keys (changed, unknown, accepted), an unreachable host, bad input refused
before any change, a --limit that matches nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from cli_run import BIN, cli, cli_json, ssh

from provisioner.errors import ExitCode

pytestmark = pytest.mark.lab


def inventory_with_known_hosts(server, tmp_path: Path, known_hosts_text: str) -> Path:
    """A copy of the server's inventory that trusts the given known_hosts content instead."""
    known = tmp_path / "known_hosts"
    known.write_text(known_hosts_text)
    inv = yaml.safe_load(server.inventory.read_text())
    hostvars = inv["lab"]["hosts"][server.name] if "lab" in inv else inv["all"]["children"]["lab"]["hosts"][server.name]
    hostvars["ansible_ssh_common_args"] = hostvars["ansible_ssh_common_args"].replace(
        str(server.known_hosts), str(known)
    )
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inv))
    return path


def test_facts_and_plan_over_ssh(lab_server):
    rc, facts = cli_json("facts", "-i", str(lab_server.inventory))
    assert rc == ExitCode.OK
    hw = facts[lab_server.name]
    assert hw["cpu"]["threads"] >= 1
    assert hw["virtualization"]["type"] != "none"  # a container, seen from inside
    rc, plan = cli_json("plan", "-i", str(lab_server.inventory), "-e", "plan_trials=1")
    assert rc == ExitCode.OK
    values = plan[lab_server.name]["values"]
    assert values["trials"] == 1
    assert values["threads_per_trial"] == values["threads_per_job"]


def test_one_ssh_login_per_host_and_nothing_left_behind(lab_server):
    """A command's playbook runs share one SSH master per host (facts.yml runs several modules),
    and the command closes it when it ends: no master, no socket left."""
    state = Path(f"/var/tmp/pv-mux-{os.getpid()}")  # short: the sockets live below it
    since = int(ssh(lab_server, "date +%s").stdout) + 1  # the second after this login
    time.sleep(1.5)
    try:
        r = subprocess.run(
            [str(BIN), "facts", "-i", str(lab_server.inventory), "--json"], capture_output=True, text=True, timeout=600,
            env={**os.environ, "PROVISIONER_STATE_DIR": str(state)},
        )
        assert r.returncode == ExitCode.OK, r.stderr
        assert [p.name for p in (state / "ssh").iterdir()] == [], "the command left its sockets behind"
        masters = subprocess.run(["pgrep", "-f", f"ControlPath={state}/"], capture_output=True, text=True)
        assert masters.stdout == "", f"SSH masters still running: {masters.stdout}"
    finally:
        shutil.rmtree(state, ignore_errors=True)
    logins = ssh(lab_server, f"journalctl -u ssh --since @{since} --no-pager -o cat | grep -c 'Accepted publickey'")
    # The command's one master, and this ssh command that counts.
    assert logins.stdout.strip() == "2", logins.stdout + logins.stderr


def test_plan_refuses_bad_input_before_any_change(lab_server):
    marker = ssh(lab_server, "stat -c %Y /etc/passwd").stdout
    r = cli("up", "-i", str(lab_server.inventory), "-e", "plan_trials=0", "-e", "common_ml_user=other")
    assert r.returncode == ExitCode.BAD_INPUT, r.stdout + r.stderr
    assert "plan_trials" in r.stderr
    assert ssh(lab_server, "id other").returncode != 0
    assert ssh(lab_server, "stat -c %Y /etc/passwd").stdout == marker


def test_changed_host_key_is_refused(lab_server, tmp_path):
    other = subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], capture_output=True
    )
    assert other.returncode == 0
    forged = f"{lab_server.address} " + " ".join((tmp_path / "k.pub").read_text().split()[:2]) + "\n"
    inv = inventory_with_known_hosts(lab_server, tmp_path, forged)
    for args in (["facts"], ["up", "--accept-new-host-keys"]):
        r = cli(*args, "-i", str(inv))
        assert r.returncode == ExitCode.UNREACHABLE, r.stdout + r.stderr
        assert "host key changed" in r.stderr
        assert "ssh-keygen -R" in r.stderr


def test_unknown_host_key_needs_explicit_trust(lab_server, tmp_path):
    inv = inventory_with_known_hosts(lab_server, tmp_path, "")
    r = cli("facts", "-i", str(inv))
    assert r.returncode == ExitCode.UNREACHABLE
    assert "not in known_hosts" in r.stderr and "--accept-new-host-keys" in r.stderr
    r = cli("facts", "-i", str(inv), "--accept-new-host-keys", "--json")
    assert r.returncode == ExitCode.OK, r.stderr
    found = subprocess.run(
        ["ssh-keygen", "-F", lab_server.address, "-f", str(tmp_path / "known_hosts")], capture_output=True, text=True
    )
    real_key = lab_server.known_hosts.read_text().split()[2]
    assert found.returncode == 0 and real_key in found.stdout, "the first-seen key was not recorded"


def test_unreachable_host(tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    ghost:\n      ansible_host: 127.0.0.1\n      ansible_port: 1\n")
    r = cli("up", "-i", str(inv), "--no-verify")
    assert r.returncode == ExitCode.UNREACHABLE
    assert "ghost: unreachable" in r.stderr


def test_limit_that_matches_nothing(lab_server):
    r = cli("up", "-i", str(lab_server.inventory), "--limit", "no-such-host")
    assert r.returncode == ExitCode.BAD_INPUT
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
