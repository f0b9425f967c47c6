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
    """The exit code and the command's data, from the JSON envelope every command prints."""
    r = cli(*args, "--json")
    assert r.stdout.strip(), f"no JSON on stdout; stderr: {r.stderr}"
    envelope = json.loads(r.stdout)
    assert envelope["schema"] == 1 and envelope["command"] == args[0], envelope
    assert envelope["exit_code"] == r.returncode, envelope
    return r.returncode, envelope["data"]


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
def wheelhouse():
    """A wheelhouse built once on this machine: the targets install with no index."""
    from provisioner import bundle

    return bundle.build_wheelhouse(bundle.default_wheelhouse(), ["core", "gbdt"]).path


@pytest.fixture(scope="module")
def offline(wheelhouse):
    return ["-e", f"mlstack_wheelhouse={wheelhouse}"]


# The baseline measures three workloads (the before -> after pairs the tests need); the smoke
# test that ends `up` runs them all.
BASELINE_WORKLOADS = "smoke_workloads=[gemm,hpo,inference]"


@pytest.fixture(scope="module")
def provisioned(lab_server, offline, wheelhouse):
    """The shared server measured unprovisioned (baseline), after a check run (nothing may
    change), a real run without the smoke test and a second run that ends with it."""
    inv = str(lab_server.inventory)
    baseline_rc, baseline = cli_json(
        "smoke", "-i", inv, "--baseline", "-e", f"smoke_baseline_wheelhouse={wheelhouse}", "-e", BASELINE_WORKLOADS
    )
    check_rc, check = cli_json("up", "-i", inv, "--check", *offline)
    ml_user_after_check = ssh(lab_server, "id ml").returncode
    first_rc, first = cli_json("up", "-i", inv, "--no-smoke", *offline)
    second_rc, second = cli_json("up", "-i", inv, *offline)
    return {
        "server": lab_server,
        "baseline": (baseline_rc, baseline),
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
    assert out["exit_code"] == rc
    # The apply and verify steps passed; the smoke test's figures decide the rest of the exit code.
    assert out["rc"] == 0 and out["verify"]["exit_code"] == ExitCode.OK, out
    assert rc == out["smoke"]["exit_code"]
    assert {h: v["changed"] for h, v in out["hosts"].items()} == {provisioned["server"].name: 0}
    assert out["smoke"]["run"]["hosts"][provisioned["server"].name]["changed"] == 0


def checks_of(report: dict) -> dict[str, dict]:
    return {c["id"]: c for c in report["checks"]}


def test_baseline_measures_the_unprovisioned_machine(provisioned):
    rc, out = provisioned["baseline"]
    host = provisioned["server"].name
    assert rc == ExitCode.OK, out  # a baseline records the machine as it is; its figures fail nothing
    rep = out["hosts"][host]
    assert rep["mode"] == "baseline"
    raw = rep["hardware"]
    assert raw["user"] == "root (empty environment)" and raw["python"].startswith("/var/tmp/provisioner-baseline")
    checks = checks_of(rep)
    assert not [c for c in checks if c.startswith("config.")], "a baseline has no plan to hold the configuration to"
    assert checks["compute.dgemm_all"]["figure"] > 0
    assert "library default" in checks["compute.dgemm_all"]["detail"]
    hpo = checks["hpo.parallel"]
    assert hpo["figure"] and hpo["figure"] > 0 and "library default" in hpo["reason"], hpo
    assert not [c for c in checks if c.startswith("gbdt")]  # not among the chosen workloads


def test_up_ends_with_the_smoke_test_against_the_hardware(provisioned):
    rc, out = provisioned["second"]
    host = provisioned["server"].name
    smoke = out["smoke"]
    rep = smoke["hosts"][host]
    assert rep["mode"] == "tuned" and rep["profile"] == "quick"
    checks = checks_of(rep)
    assert set(checks) >= {
        "host.load", "config.threads.login_shell", "config.threads.systemd_service", "config.thp.enabled", "config.governor",
        "config.data_mount", "compute.dgemm_all", "compute.dgemm_one", "compute.sgemm_all", "compute.sgemm_one",
        "memory.triad", "gbdt.xgboost", "gbdt.lightgbm", "gbdt.catboost", "torch.mlp", "hpo.parallel",
        "hpo.oversubscribed", "data.parquet", "inference.p50", "inference.p99",
    }
    threads = rep["hardware"]["threads"]
    # Configuration as the workloads see it: thread_env's values in a login shell and in a service.
    for key in ("config.threads.login_shell", "config.threads.systemd_service"):
        assert checks[key]["status"] == "pass", checks[key]
        assert f"OMP_NUM_THREADS={threads}" in checks[key]["detail"]
    assert checks["config.governor"]["status"] == "skip" and "not applicable" in checks["config.governor"]["reason"]
    # Figures against limits derived from this hardware, each with its derivation.
    for key in ("compute.dgemm_all", "compute.sgemm_one", "gbdt.xgboost", "hpo.parallel", "data.parquet", "inference.p99"):
        c = checks[key]
        assert c["figure"] > 0 and c["limit"] > 0 and c["ratio"] == pytest.approx(c["figure"] / c["limit"]), c
        assert c["basis"] and c["status"] in ("pass", "warn", "fail"), c
    assert rep["hardware"]["fp64_flops_per_cycle"] in (4, 8, 16, 32) and rep["hardware"]["clock_ghz"] > 0
    assert "GHz" in checks["compute.dgemm_all"]["basis"]
    assert checks["gbdt.xgboost"]["detail"].startswith("1,000,000 x 28, depth 8, 100 trees")
    assert "median of" in checks["compute.dgemm_all"]["detail"]
    # The stack was installed without torch: said so, with the component that brings it.
    assert checks["torch.mlp"]["status"] == "skip" and "component torch" in checks["torch.mlp"]["reason"]
    # The baseline measured before provisioning sits next to the tuned figures.
    assert rep["baseline_started"] == provisioned["baseline"][1]["hosts"][host]["started"]
    for key in ("compute.dgemm_all", "hpo.parallel", "inference.p99"):
        assert checks[key]["baseline"] > 0 and checks[key]["gain"] > 0, checks[key]
    assert checks["data.parquet"]["baseline"] is None  # not measured before
    html = Path(smoke["html"]).read_text()
    assert host in html and "DGEMM, all cores" in html


def test_smoke_flags_a_regression_and_a_wrong_blas_kernel(provisioned):
    """A later run far below the last one is flagged: here OpenBLAS forced to a Prescott kernel."""
    server = provisioned["server"]
    inv = str(server.inventory)
    assert ssh(server, "echo 'export OPENBLAS_CORETYPE=Prescott' >> ~ml/.profile").returncode == 0
    try:
        rc, out = cli_json("smoke", "--quick", "-i", inv, "-e", "smoke_workloads=[gemm]")
    finally:
        ssh(server, "sed -i '/OPENBLAS_CORETYPE/d' ~ml/.profile")
    rep = out["hosts"][server.name]
    dgemm = checks_of(rep)["compute.dgemm_one"]
    assert dgemm["regression"] and "regression" in dgemm["reason"], dgemm
    assert dgemm["figure"] < 0.85 * dgemm["previous"]
    # OpenBLAS names the kernel it runs (Prescott is reported under its family name, e.g. Katmai).
    assert dgemm["status"] == "fail" and "openblas" in dgemm["detail"], dgemm
    assert dgemm["detail"].split("openblas ")[-1] != checks_of(provisioned["second"][1]["smoke"]["hosts"][server.name])[
        "compute.dgemm_one"]["detail"].split("openblas ")[-1], "the kernel did not change"
    assert rep["previous_started"] == provisioned["second"][1]["smoke"]["hosts"][server.name]["started"]
    assert rc == ExitCode.HOST_FAILED


def test_smoke_refuses_an_unprovisioned_host(fresh_lab_server):
    server = fresh_lab_server("pv-bare")
    r = cli("smoke", "-i", str(server.inventory))
    assert r.returncode == ExitCode.BAD_INPUT, r.stdout + r.stderr
    assert "no ML environment at /opt/mlstack" in r.stderr and "provisioner up" in r.stderr


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
