"""A server as a fresh minimal install leaves it (`lab up --fresh`: no python3-apt, no /etc/hosts,
its host key in no known_hosts), met as a new user meets it: the README's commands with default
options and the default strategy (Mitogen), first contact through --accept-new-host-keys.

One server for the module, in order: a check run (nothing may change: not the packages, not /etc,
not the control node's known_hosts), the first real run (one run, exit 0), a changed host key
refused, then undo (the packages, enabled units, users and groups as before the first run, but
for what docs/roles.md names as kept on purpose)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from provisioner import lab
from provisioner.errors import ExitCode

pytestmark = pytest.mark.lab

BIN = Path(sys.executable).parent / "provisioner"
NAME = "pv-fresh"
# docs/roles.md, "Kept on purpose": role storage's tools (they assemble, mount and repair the array).
KEPT_PACKAGES = {"mdadm", "xfsprogs", "btrfs-progs"}
# What a run writes first on a new server (its configuration, its state, the ML environment).
PRODUCT_PATHS = ("/etc/provisioner", "/var/lib/provisioner", "/opt/mlstack")


def cli_json(*args: str, timeout: int = 1800) -> tuple[int, dict, str]:
    """Exit code, the command's data and its whole output (for failure messages)."""
    r = subprocess.run([str(BIN), *args, "--json"], capture_output=True, text=True, timeout=timeout)
    output = f"exit {r.returncode}\nstdout:\n{r.stdout[-20000:]}\nstderr:\n{r.stderr[-5000:]}"
    assert r.stdout.strip(), output
    envelope = json.loads(r.stdout)
    assert envelope["exit_code"] == r.returncode, output
    return r.returncode, envelope["data"], output


def ssh(server: lab.LabServer, command: str) -> str:
    """COMMAND's output on the server, through the lab's own way in (ssh_config, with the key the
    lab recorded apart from the inventory's known_hosts)."""
    r = subprocess.run(["ssh", "-F", str(server.ssh_config), server.name, command], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{command}: {r.stderr}"
    return r.stdout


def snapshot(server: lab.LabServer) -> dict[str, set[str]]:
    return {
        # Status with the name: a package purged shows as gone, one only removed as "rc".
        "packages": set(ssh(server, r"dpkg-query -W -f '${db:Status-Abbrev} ${Package}\n'").splitlines()),
        "units": {line.split()[0] for line in ssh(server, "systemctl list-unit-files --state=enabled --no-legend").splitlines()},
        "users": set(ssh(server, "cut -d: -f1 /etc/passwd").split()),
        "groups": set(ssh(server, "cut -d: -f1 /etc/group").split()),
    }


def etc_checksum(server: lab.LabServer) -> str:
    """One checksum over every file under /etc: names, contents, modes and owners, links' targets."""
    return ssh(
        server,
        "cd /etc && find . -xdev \\( -type f -o -type l \\) -printf '%p %m %U %G %l\\n' | sort | sha256sum"
        " && find . -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum",
    )


@pytest.fixture(scope="module")
def wheelhouse():
    """The default stack's wheelhouse, built once on this machine (as tests/integration/test_up.py's)."""
    from provisioner import bundle

    return bundle.build_wheelhouse(bundle.default_wheelhouse(), list(bundle.DEFAULT_COMPONENTS)).path


@pytest.fixture(scope="module")
def fresh(lab_requirements, wheelhouse):
    """The fresh server, recorded before anything touches it, then a check run and the first run
    (both with --accept-new-host-keys, as the README's first contact) with what each left."""
    lab.down(NAME)  # a server of that name left by an interrupted session is not fresh
    server = lab.up(NAME, fresh=True)
    try:
        inv = str(server.inventory)
        offline = ["-e", f"mlstack_wheelhouse={wheelhouse}"]
        state: dict = {"server": server, "before": snapshot(server), "etc_before": etc_checksum(server)}
        state["known_hosts_before"] = server.known_hosts.read_text()
        state["check"] = cli_json("up", "--check", "-i", inv, "--accept-new-host-keys", *offline)
        state["after_check"] = snapshot(server)
        state["etc_after_check"] = etc_checksum(server)
        state["known_hosts_after_check"] = server.known_hosts.read_text()
        state["written_by_check"] = ssh(
            server, f"ls -d {' '.join(PRODUCT_PATHS)} /var/lib/apt/lists/*_Packages* 2>/dev/null; true"
        )
        started = time.monotonic()
        state["first"] = cli_json("up", "-i", inv, "--accept-new-host-keys", "--no-smoke", *offline)
        state["first_seconds"] = time.monotonic() - started
        yield state
    finally:
        lab.down(NAME)


def test_check_on_a_fresh_server_changes_nothing_and_says_what_it_could_not_predict(fresh):
    rc, out, output = fresh["check"]
    server = fresh["server"]
    assert fresh["known_hosts_before"] == "", "the fresh server's key must be in no known_hosts"
    assert rc == ExitCode.OK, output
    assert out["check"] is True
    assert fresh["after_check"] == fresh["before"], "check mode changed the packages, units or users"
    assert fresh["etc_after_check"] == fresh["etc_before"], "check mode changed /etc"
    assert fresh["known_hosts_after_check"] == "", "check mode recorded the host key in the inventory's known_hosts"
    assert fresh["written_by_check"] == "", "check mode wrote the product's files or fetched apt's package lists"
    warnings = out["hosts"][server.name]["warnings"]
    assert any("could not predict" in w and "python3-apt" in w for w in warnings), output


def test_the_first_run_on_a_fresh_server_succeeds_in_one_go(fresh):
    rc, out, output = fresh["first"]
    server = fresh["server"]
    assert rc == ExitCode.OK, output
    assert out["hosts"][server.name]["failed"] == 0 and out["hosts"][server.name]["changed"] > 0, output
    # ssh records it hashed (Debian's HashKnownHosts): ssh-keygen -F finds it by address.
    found = subprocess.run(["ssh-keygen", "-F", server.address, "-f", str(server.known_hosts)], capture_output=True, text=True)
    made = " ".join((server.root / "lab_known_hosts").read_text().split()[1:3])  # the key the lab made
    assert found.returncode == 0 and made in found.stdout, "the first run must record the key it accepted"
    assert len(server.known_hosts.read_text().splitlines()) == 1
    assert "python3-apt" in {p.split()[-1] for p in snapshot(server)["packages"] if p.startswith("ii ")}
    print(f"first up of a fresh server: {fresh['first_seconds']:.1f} s")


def test_a_changed_host_key_is_refused_even_when_new_ones_are_accepted(fresh, tmp_path):
    server = fresh["server"]
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known = tmp_path / "known_hosts"
    known.write_text(f"{server.address} {' '.join(Path(f'{other}.pub').read_text().split()[:2])}\n")
    inv = yaml.safe_load(server.inventory.read_text())
    host = inv["all"]["children"]["lab"]["hosts"][server.name]
    host["ansible_ssh_common_args"] = host["ansible_ssh_common_args"].replace(str(server.known_hosts), str(known))
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inv))
    before = known.read_text()
    rc, out, output = cli_json("up", "--check", "-i", str(path), "--accept-new-host-keys")
    assert rc == ExitCode.UNREACHABLE, output
    assert any("host key changed" in e for e in out["hosts"][server.name]["errors"]), output
    assert known.read_text() == before


def test_undo_restores_packages_units_and_users(fresh):
    server = fresh["server"]
    rc, _, output = cli_json("undo", "-i", str(server.inventory))
    assert rc == ExitCode.OK, output
    after = snapshot(server)
    before = fresh["before"]
    added = after["packages"] - before["packages"]
    assert {p.split()[-1] for p in added} <= KEPT_PACKAGES, f"packages the run added and undo left: {sorted(added)}"
    assert before["packages"] <= after["packages"], f"packages undo took: {sorted(before['packages'] - after['packages'])}"
    assert after["units"] == before["units"], (sorted(after["units"] - before["units"]), sorted(before["units"] - after["units"]))
    assert after["users"] == before["users"], (sorted(after["users"] - before["users"]), sorted(before["users"] - after["users"]))
    assert after["groups"] == before["groups"], (
        sorted(after["groups"] - before["groups"]),
        sorted(before["groups"] - after["groups"]),
    )
