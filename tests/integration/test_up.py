"""`provisioner up`, `verify`, `facts` and `plan` against a real lab server over real SSH."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provisioner.errors import ExitCode

pytestmark = pytest.mark.lab

BIN = Path(sys.executable).parent / "provisioner"


def cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=timeout)


def cli_json(*args: str) -> tuple[int, dict]:
    r = cli(*args, "--json")
    assert r.stdout.strip(), f"no JSON on stdout; stderr: {r.stderr}"
    return r.returncode, json.loads(r.stdout)


def ssh(server, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-F", str(server.ssh_config), server.name, command], capture_output=True, text=True, timeout=60
    )


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


@pytest.fixture(scope="module")
def offline():
    """The ML stack comes from a wheelhouse built once on this machine (no index on the target)."""
    from provisioner import bundle

    result = bundle.build_wheelhouse(bundle.default_wheelhouse(), ["core", "gbdt"])
    return ["-e", f"mlstack_wheelhouse={result.path}"]


@pytest.fixture(scope="module")
def provisioned(lab_server, offline):
    """The shared server after a check run (nothing may change) and then two real runs."""
    inv = str(lab_server.inventory)
    check_rc, check = cli_json("up", "-i", inv, "--check", *offline)
    ml_user_after_check = ssh(lab_server, "id ml").returncode
    first_rc, first = cli_json("up", "-i", inv, *offline)
    second_rc, second = cli_json("up", "-i", inv, *offline)
    return {
        "server": lab_server,
        "check": (check_rc, check, ml_user_after_check),
        "first": (first_rc, first),
        "second": (second_rc, second),
        "offline": offline,
    }


def test_check_mode_reports_changes_and_changes_nothing(provisioned):
    rc, out, ml_user_rc = provisioned["check"]
    host = provisioned["server"].name
    assert rc == ExitCode.OK, out
    assert out["check"] is True
    assert out["hosts"][host]["changed"] > 0, "a fresh server must show what would change"
    assert any("ML user" in c["task"] for c in out["changes"])
    assert ml_user_rc != 0, "check mode created the ML user"


def test_first_run_changes_and_verifies(provisioned):
    rc, out = provisioned["first"]
    host = provisioned["server"].name
    assert rc == ExitCode.OK, out
    assert out["hosts"][host]["changed"] > 0
    assert out["hosts"][host]["failed"] == 0
    checks = out["verify"]["hosts"][host]
    assert [c for c in checks if c["outcome"] not in ("passed", "skipped")] == []
    assert sum(c["outcome"] == "passed" for c in checks) >= 7, checks
    assert any(c["check"].startswith("test_doctor") and c["outcome"] == "passed" for c in checks), checks
    # Skips are for what a container cannot show (read-only kernel knobs), each with its reason.
    assert all(c["message"] for c in checks if c["outcome"] == "skipped"), checks
    assert out["plan"][host]["values"]["threads_per_job"] >= 1


def test_second_run_changes_nothing(provisioned):
    rc, out = provisioned["second"]
    assert rc == ExitCode.OK, out
    assert {h: v["changed"] for h, v in out["hosts"].items()} == {provisioned["server"].name: 0}


def test_verify_catches_a_broken_host(provisioned):
    server = provisioned["server"]
    rc, out = cli_json("verify", "-i", str(server.inventory))
    assert rc == ExitCode.OK, out
    assert ssh(server, "chmod 0700 /etc/provisioner").returncode == 0
    try:
        rc, out = cli_json("verify", "-i", str(server.inventory))
        failed = [c for c in out["hosts"][server.name] if c["outcome"] == "failed"]
        assert rc == ExitCode.HOST_FAILED
        # The doctor (run as the ML user) cannot read the plan there either: it fails too.
        assert "test_provisioner_directories[common_config_dir]" in [c["check"] for c in failed]
        assert {c["check"] for c in failed} <= {"test_provisioner_directories[common_config_dir]", "test_doctor_passes"}
    finally:
        ssh(server, "chmod 0755 /etc/provisioner")


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


def test_plain_ansible_playbook_runs_the_same_roles(provisioned):
    """An Ansible user needs no CLI: site.yml with ansible-playbook, idempotent."""
    server = provisioned["server"]
    bindir = Path(sys.executable).parent
    r = subprocess.run(
        # The roles the CLI applied above; plain Ansible must find them converged (changed=0).
        [str(bindir / "ansible-playbook"), "-i", str(server.inventory), "playbooks/site.yml", "--tags", "plan,common,thread_env"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={"PATH": f"{bindir}:/usr/sbin:/usr/bin:/sbin:/bin", "ANSIBLE_NOCOLOR": "1"},
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    recap = r.stdout.split("PLAY RECAP", 1)[1]
    assert "changed=0" in recap and "failed=0" in recap, recap


def test_one_role_by_tag(provisioned):
    """--tags common alone: the plan still runs (other roles' defaults read it), nothing changes."""
    rc, out = cli_json("up", "-i", str(provisioned["server"].inventory), "--tags", "common", *provisioned["offline"])
    assert rc == ExitCode.OK, out
    assert out["hosts"][provisioned["server"].name]["changed"] == 0
    assert {c["check"].split("[")[0] for c in out["verify"]["hosts"][provisioned["server"].name]} >= {
        "test_base_packages_installed", "test_applied_plan_recorded"}
