"""`provisioner up` as a new user meets a server: a fresh minimal install (`lab up --fresh`: no
python3-apt, no /etc/hosts, its host key in no known_hosts), the README's commands with the
default options and the default strategy, first contact through --accept-new-host-keys.

One server for the module, in order: a check run (nothing may change: not the packages, not
/etc, not the control node's known_hosts), the first real run (one go, verified), a second run
that changes nothing and ends with the smoke test against the hardware, a user's own code in the
ML user's login shell, verify, plain ansible-playbook, status and drift, a changed host key
refused, and undo last (the packages, units, users and groups as before the first run, but for
what docs/roles.md names as kept on purpose).

The unprovisioned baseline the smoke test compares with is measured before the first run on a
second, stock server of the same machine under the fresh server's inventory name: measuring it
on the fresh server itself would install what the first run must meet missing (python3-apt)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_run import BIN, cli, cli_json, ssh
from prometheus_client.parser import text_string_to_metric_families

from provisioner import lab
from provisioner.errors import ExitCode
from provisioner.lab import cpu

pytestmark = pytest.mark.lab

NAME = "pv-up"
BASE = "pv-up-base"
# Both servers measure (the smoke test, the baseline, tune): their processes run in a cpu cgroup
# weighing ten sessions, ahead of the suite's other work on this machine's two shared cores, as
# on a server of their own (docs/lab.md, "A server that measures").
CPU_WEIGHT = 1000
# docs/roles.md, "Kept on purpose": role storage's tools (they assemble, mount and repair the array).
KEPT_PACKAGES = {"mdadm", "xfsprogs", "btrfs-progs"}
# What a run writes first on a new server (its configuration, its state, the ML environment).
PRODUCT_PATHS = ("/etc/provisioner", "/var/lib/provisioner", "/opt/mlstack", "/opt/mlstack-envs")


def out_of(server, command: str) -> str:
    """COMMAND's output on the server; a failed command fails the test."""
    r = ssh(server, command)
    assert r.returncode == 0, f"{command}: {r.stderr}"
    return r.stdout


def snapshot(server) -> dict[str, set[str]]:
    return {
        # Status with the name: a package purged shows as gone, one only removed as "rc".
        "packages": set(out_of(server, r"dpkg-query -W -f '${db:Status-Abbrev} ${Package}\n'").splitlines()),
        "units": {ln.split()[0] for ln in out_of(server, "systemctl list-unit-files --state=enabled --no-legend").splitlines()},
        "users": set(out_of(server, "cut -d: -f1 /etc/passwd").split()),
        "groups": set(out_of(server, "cut -d: -f1 /etc/group").split()),
    }


def outside_the_cpu_group(server) -> list[str]:
    """The server's processes (its PID namespace, seen from this machine) not in its cpu cgroup."""
    namespace = os.readlink(f"/proc/{server.leader_pid}/ns/pid")
    group = "/" + cpu.group_name(server.name)
    outside = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.readlink(proc / "ns/pid") == namespace:
                # cgroup v1: the cpu hierarchy's line; v2: the one line (nspawn makes groups below).
                lines = dict(line.split(":", 2)[1:] for line in (proc / "cgroup").read_text().splitlines())
                where = lines.get("cpu", lines.get("cpu,cpuacct", lines.get("", "")))
                if not (where == group or where.startswith(group + "/")):
                    outside.append(f"{proc.name}: {(proc / 'comm').read_text().strip()} in {where}")
        except OSError:  # gone meanwhile
            continue
    return outside


def etc_checksum(server) -> str:
    """One checksum over every file under /etc: names, contents, modes and owners, links' targets."""
    return out_of(
        server,
        "cd /etc && find . -xdev \\( -type f -o -type l \\) -printf '%p %m %U %G %l\\n' | sort | sha256sum"
        " && find . -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum",
    )


@pytest.fixture(scope="module")
def wheelhouse():
    """A wheelhouse built once on this machine with the default stack (role mlstack's default
    components): the targets install with no index, what a plain `provisioner up` installs."""
    from provisioner import bundle

    # bundle.DEFAULT_COMPONENTS is role mlstack's default list (tests/unit/test_bundle.py holds them equal).
    return bundle.build_wheelhouse(bundle.default_wheelhouse(), list(bundle.DEFAULT_COMPONENTS)).path


@pytest.fixture(scope="module")
def offline(wheelhouse):
    return ["-e", f"mlstack_wheelhouse={wheelhouse}"]


@pytest.fixture(scope="module")
def base_server(lab_requirements):
    """A stock, never provisioned server: the baseline's machine, and the host smoke and status refuse."""
    lab.down(BASE)
    try:
        yield lab.up(BASE, cpu_weight=CPU_WEIGHT)
    finally:
        lab.down(BASE)


def under_the_name(server, name: str) -> Path:
    """SERVER's inventory with its host called NAME (what the control node files its results under)."""
    inv = yaml.safe_load(server.inventory.read_text())
    hosts = inv["all"]["children"]["lab"]["hosts"]
    hosts[name] = hosts.pop(server.name)
    path = server.inventory.with_name(f"as-{name}.yml")
    path.write_text(yaml.safe_dump(inv))
    return path


# The baseline measures one workload, GEMM, in a stock environment of what it imports: the
# before -> after pair is built the same way for every check (tests/unit/test_smoke.py), while a
# baseline of the Optuna study and the inference loop took 224 of its 338 s here (every trial and
# the model on all threads at once, as stock libraries run them). The smoke test that ends `up`
# runs every workload.
BASELINE = ("-e", "smoke_workloads=[gemm]", "-e", "smoke_baseline_packages=[numpy,threadpoolctl]")


@pytest.fixture(scope="module")
def provisioned(lab_requirements, base_server, offline, wheelhouse):
    """The fresh server recorded before anything touches it, then a check run and the first run
    (both with --accept-new-host-keys, as the README's first contact) with what each left, the
    baseline measured between them (on base_server, under this server's name), and a second run
    that ends with the smoke test (its verify left out: the first run's passed, and
    test_verify_catches_a_broken_host runs verify again)."""
    lab.down(NAME)  # a server of that name left by an interrupted session is not fresh
    server = lab.up(NAME, fresh=True, cpu_weight=CPU_WEIGHT)
    try:
        inv = str(server.inventory)
        state: dict = {"server": server, "offline": offline, "before": snapshot(server), "etc_before": etc_checksum(server)}
        state["known_hosts_before"] = server.known_hosts.read_text()
        state["check"] = cli_json("up", "-i", inv, "--check", "--accept-new-host-keys", *offline)
        state["after_check"] = snapshot(server)
        state["etc_after_check"] = etc_checksum(server)
        state["known_hosts_after_check"] = server.known_hosts.read_text()
        state["written_by_check"] = out_of(
            server, f"ls -d {' '.join(PRODUCT_PATHS)} /var/lib/apt/lists/*_Packages* 2>/dev/null; true"
        )
        state["baseline"] = cli_json(
            "smoke", "-i", str(under_the_name(base_server, NAME)), "--baseline",
            "-e", f"smoke_baseline_wheelhouse={wheelhouse}", *BASELINE,
        )
        started = time.monotonic()
        state["first"] = cli_json("up", "-i", inv, "--accept-new-host-keys", "--no-smoke", *offline)
        state["first_seconds"] = time.monotonic() - started
        state["second"] = cli_json("up", "-i", inv, "--no-verify", *offline)
        yield state
    finally:
        lab.down(NAME)


def test_check_on_a_fresh_server_changes_nothing_and_says_what_it_could_not_predict(provisioned):
    rc, out = provisioned["check"]
    host = provisioned["server"].name
    assert provisioned["known_hosts_before"] == "", "the fresh server's key must be in no known_hosts"
    assert rc == ExitCode.OK, out
    assert out["check"] is True
    assert out["hosts"][host]["changed"] > 0, "a fresh server must show what would change"
    assert any("ML user" in c["task"] for c in out["changes"])
    assert provisioned["after_check"] == provisioned["before"], "check mode changed the packages, units or users"
    assert provisioned["etc_after_check"] == provisioned["etc_before"], "check mode changed /etc"
    assert provisioned["known_hosts_after_check"] == "", "check mode recorded the host key in the inventory's known_hosts"
    assert provisioned["written_by_check"] == "", "check mode wrote the product's files or fetched apt's package lists"
    warnings = out["hosts"][host]["warnings"]
    assert any("could not predict" in w and "python3-apt" in w for w in warnings), out


def test_the_first_run_on_a_fresh_server_succeeds_in_one_go_and_verifies(provisioned):
    rc, out = provisioned["first"]
    server = provisioned["server"]
    host = server.name
    assert rc == ExitCode.OK, out
    assert out["hosts"][host]["changed"] > 0 and out["hosts"][host]["failed"] == 0, out
    # ssh records it hashed (Debian's HashKnownHosts): ssh-keygen -F finds it by address.
    found = subprocess.run(["ssh-keygen", "-F", server.address, "-f", str(server.known_hosts)], capture_output=True, text=True)
    made = " ".join((server.root / "lab_known_hosts").read_text().split()[1:3])  # the key the lab made
    assert found.returncode == 0 and made in found.stdout, "the first run must record the key it accepted"
    assert len(server.known_hosts.read_text().splitlines()) == 1
    # Every process of the server runs in its cpu cgroup (lab up --cpu-weight), whatever session it is in.
    assert outside_the_cpu_group(server) == []
    assert "python3-apt" in {p.split()[-1] for p in snapshot(server)["packages"] if p.startswith("ii ")}
    checks = out["verify"]["hosts"][host]
    assert [c for c in checks if c["outcome"] not in ("passed", "skipped")] == []
    assert sum(c["outcome"] == "passed" for c in checks) >= 7, checks
    assert any(c["check"].startswith("test_doctor") and c["outcome"] == "passed" for c in checks), checks
    # Skips are for what a container cannot show (read-only kernel knobs), each with its reason.
    assert all(c["message"] for c in checks if c["outcome"] == "skipped"), checks
    assert out["plan"][host]["values"]["threads_per_job"] >= 1
    print(f"first up of a fresh server: {provisioned['first_seconds']:.1f} s")


def test_second_run_changes_nothing(provisioned):
    rc, out = provisioned["second"]
    assert out["exit_code"] == rc
    # The apply step passed; the smoke test's figures decide the rest of the exit code.
    assert out["rc"] == 0 and out["verify"] is None, out
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
    assert not [c for c in checks if c.startswith(("gbdt", "hpo"))]  # not among the chosen workloads


def test_up_ends_with_the_smoke_test_against_the_hardware(provisioned):
    _rc, out = provisioned["second"]
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
        # The team's jobs (docs/workloads.md), each in the quick profile.
        "sklearn.forest", "sklearn.grid", "sklearn.threads", "features.polars", "features.pandas",
        "matrix.cv", "dataloader.samples", "tensorflow.step",
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
        assert c["figure"] is not None and c["limit"] is not None, c
        assert c["figure"] > 0 and c["limit"] > 0 and c["ratio"] == pytest.approx(c["figure"] / c["limit"]), c
        assert c["basis"] and c["status"] in ("pass", "warn", "fail"), c
    assert rep["hardware"]["fp64_flops_per_cycle"] in (4, 8, 16, 32) and rep["hardware"]["clock_ghz"] > 0
    assert "GHz" in checks["compute.dgemm_all"]["basis"]
    # Quick trains 125,000 rows per thread (250,000 to 1,000,000).
    rows = max(250_000, min(1_000_000, 125_000 * threads))
    assert checks["gbdt.xgboost"]["detail"].startswith(f"{rows:,} x 28, depth 8, 100 trees")
    assert "median of" in checks["compute.dgemm_all"]["detail"]
    # The default stack brings torch and Optuna; TensorFlow is opt-in: a skip naming its component.
    assert checks["torch.mlp"]["figure"] > 0, checks["torch.mlp"]
    assert checks["tensorflow.step"]["status"] == "skip" and "tensorflow" in checks["tensorflow.step"]["reason"]
    # GridSearchCV's loky workers run within their share of BLAS threads (no oversubscription).
    assert checks["sklearn.threads"]["status"] == "pass", checks["sklearn.threads"]
    for key in ("sklearn.grid", "features.polars", "dataloader.samples"):
        assert checks[key]["figure"] > 0 and checks[key]["limit"] > 0, checks[key]
    # The baseline measured before provisioning sits next to the tuned figures.
    assert rep["baseline_started"] == provisioned["baseline"][1]["hosts"][host]["started"]
    for key in ("compute.dgemm_all", "compute.sgemm_one"):
        assert checks[key]["baseline"] > 0 and checks[key]["gain"] > 0, checks[key]
    assert checks["hpo.parallel"]["baseline"] is None  # not measured before
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


# ---------------------------------------------------------------- a user's own code, as they run it

# A user's GridSearchCV with no thread argument of any kind (no inner_max_num_threads, no
# threadpool_limits); only the scorer reports, from inside whichever process scores, the
# BLAS/OpenMP pools threadpoolctl sees there.
PLAIN_GRID = """
import json, os, sys
from sklearn.datasets import make_classification
from sklearn.ensemble import RandomForestClassifier
from sklearn.model_selection import GridSearchCV
from threadpoolctl import threadpool_info

def pools():
    return [(i["user_api"], i["num_threads"]) for i in threadpool_info()]

def scorer(estimator, x, y):
    print(json.dumps({"pid": os.getpid(), "pools": pools()}), flush=True)
    return float((estimator.predict(x) == y).mean())

x, y = make_classification(200, 8, random_state=0)
grid = {"max_depth": [3, 5]}
GridSearchCV(RandomForestClassifier(), grid, cv=2, n_jobs=int(sys.argv[1]), scoring=scorer).fit(x, y)
print(json.dumps({"main": os.getpid(), "pools": pools()}), flush=True)
"""


def put(server, path: str, text: str) -> None:
    """A file on the host, readable by the ML user."""
    r = subprocess.run(["ssh", "-F", str(server.ssh_config), server.name, f"cat > {path} && chmod 0644 {path}"],
                       input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def host_threads(server) -> int:
    """The plan's threads of one job, as the run applied it on the host."""
    return int(json.loads(ssh(server, "cat /etc/provisioner/plan.json").stdout)["values"]["threads_per_job"])


def plain_grid_search(server) -> tuple[int, list[dict], dict]:
    """The plain search in a login shell of the ML user (`su - ml`), n_jobs=2; (threads, workers, main)."""
    threads = host_threads(server)
    put(server, "/tmp/plain_grid.py", PLAIN_GRID)
    # A guard against a hung run, not a speed limit: two workers import scikit-learn on a busy host.
    r = subprocess.run(["ssh", "-F", str(server.ssh_config), server.name, "su - ml -c '/opt/mlstack/bin/python /tmp/plain_grid.py 2'"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    main = rows.pop()
    return threads, [w for w in rows if w["pid"] != main["main"]], main


def test_a_plain_grid_search_in_the_ml_users_login_shell_keeps_each_worker_within_its_share(provisioned):
    """Two loky workers on the plan's cores: each runs at most threads // 2 BLAS and OpenMP
    threads (joblib alone would pass the login shell's OMP_NUM_THREADS into both), while the main
    process keeps the plan's count."""
    threads, workers, main = plain_grid_search(provisioned["server"])
    assert threads >= 2, "one core: no share smaller than the whole to hold the workers to"
    share = threads // 2
    assert workers, "no loky worker scored: the search ran in the main process"
    over = [w for w in workers if max(n for _api, n in w["pools"]) > share]
    assert not over, f"loky workers above their share of {share} thread(s) on {threads} cores: {over}"
    assert {api for w in workers for api, _n in w["pools"]} >= {"blas", "openmp"}, workers
    assert max(n for api, n in main["pools"] if api == "blas") == threads, main


ML_PYTHON = "import os, shutil, sys; print(sys.prefix, shutil.which('pip'), os.environ.get('ML_ENV_TRIAL', '-'))"


def test_python_and_pip_are_the_ml_environments_in_a_login_shell_and_in_ml_env(provisioned):
    """The README's `ml-env --trials N -- python tune.py` as written: as the ML user in a login
    shell, and from an ssh command as root (whose PATH has no ML environment)."""
    server = provisioned["server"]
    put(server, "/tmp/which_python.py", ML_PYTHON + "\n")
    login = ssh(server, "su - ml -c 'command -v python; command -v pip; python /tmp/which_python.py'")
    assert login.returncode == 0, login.stderr
    assert login.stdout.splitlines() == ["/opt/mlstack/bin/python", "/opt/mlstack/bin/pip", "/opt/mlstack /opt/mlstack/bin/pip -"]
    for how in ("su - ml -c 'ml-env --trials 2 -- python /tmp/which_python.py'",
                "ml-env --trials 2 -- python /tmp/which_python.py"):
        r = ssh(server, how)
        assert r.returncode == 0, (how, r.stderr)
        assert sorted(r.stdout.splitlines()) == ["/opt/mlstack /opt/mlstack/bin/pip 0", "/opt/mlstack /opt/mlstack/bin/pip 1"], how
    # Only the ML group's login shells: root's PATH is left as it was.
    assert ssh(server, "bash -lc 'command -v python || echo none'").stdout.strip() != "/opt/mlstack/bin/python"


def test_smoke_and_status_refuse_an_unprovisioned_host(base_server):
    server = base_server
    r = cli("smoke", "-i", str(server.inventory))
    assert r.returncode == ExitCode.BAD_INPUT, r.stdout + r.stderr
    assert "no ML environment at /opt/mlstack" in r.stderr and "provisioner up" in r.stderr
    # status reaches the host and finds nothing to compare: one line with the script's reason
    # and the run that fixes it (not ssh's "Shared connection to ... closed").
    r = cli("status", "-i", str(server.inventory))
    assert r.returncode == ExitCode.BAD_INPUT, r.stdout + r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "never provisioned: no expected state in /etc/provisioner/expected" in line, line
    assert "(the host was reached; nothing was changed)" in line, line
    assert line.endswith(f"provision it first: provisioner up -i {server.inventory} --limit {server.name}"), line


def test_verify_catches_a_broken_host(provisioned):
    """The converged host passed verify after the first `up` (the tests above); broken, it fails."""
    server = provisioned["server"]
    assert provisioned["first"][1]["verify"]["exit_code"] == ExitCode.OK
    assert ssh(server, "chmod 0700 /etc/provisioner").returncode == 0
    try:
        # The two roles whose checks read that directory (a full verify is the first run's, above).
        rc, out = cli_json("verify", "-i", str(server.inventory), "--tags", "common,mlstack")
        failed = [c for c in out["hosts"][server.name] if c["outcome"] == "failed"]
        assert rc == ExitCode.HOST_FAILED
        # The doctor (run as the ML user) cannot read the plan there either: it fails too.
        assert "test_provisioner_directories[common_config_dir]" in [c["check"] for c in failed]
        assert {c["check"] for c in failed} <= {"test_provisioner_directories[common_config_dir]", "test_doctor_passes"}
    finally:
        ssh(server, "chmod 0755 /etc/provisioner")


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


# ---------------------------------------------------------------- tune

# A user's own host_vars file: tune --write must keep it as it is.
USER_VARS = "---\n# rack 4, the box next to the switch\nserving_enabled: false  # no model server here\n"
# The search of two workloads, each with a knob of its own in pairs against the plan's: Polars'
# threads, a worker in the ML user's login shell with the candidate's variable on top, and the model
# server's workers, a throwaway server the root parent starts for each measurement.
TUNE = ("--workloads", "features,serving", "--knobs", "polars_threads,serving_workers", "--budget", "3m")
BUDGET_S = 180


def fleet_of_two(server, other) -> Path:
    """One inventory with SERVER and OTHER, each as its own inventory names it (beside SERVER's)."""
    inv = yaml.safe_load(server.inventory.read_text())
    hosts = inv["all"]["children"]["lab"]["hosts"]
    hosts.update(yaml.safe_load(other.inventory.read_text())["all"]["children"]["lab"]["hosts"])
    path = server.inventory.with_name("fleet.yml")
    path.write_text("---\n# the two lab servers of this machine: one hardware class\n" + yaml.safe_dump(inv))
    return path


def test_tune_measures_a_class_of_two_once_and_writes_back_only_what_it_kept(provisioned, base_server):
    """tune --write on a fleet of two servers of the same hardware (the provisioned one and the stock
    baseline server, both on this machine): only the provisioned one is measured, every candidate in
    pairs as the ML user runs it, nothing on either host changed but its study, and only what was kept
    written, once, into the class's group (the user's host_vars as they were). Which rule wins on a
    shared 2-core server is the noise's to say: both outcomes are held to what they must leave. A run
    resuming its study, and a kernel knob put back after Ctrl-C, are tests/host's (on this machine); a
    run without --write writes nothing, and the group as Ansible reads it, are tests/unit/test_tune.py's."""
    server = provisioned["server"]
    host = server.name
    fleet = fleet_of_two(server, base_server)
    listed = fleet.read_text()
    path = server.inventory.parent / "host_vars" / f"{host}.yml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(USER_VARS)
    etc = etc_checksum(server)
    etc_base = etc_checksum(base_server)
    values = plan_values(server)  # before --write: the plan then carries what was kept
    planned, serving_planned = values["polars_threads"], values
    # --force: the suite's other worker keeps these two cores busy, which tune refuses by default
    # (tests/unit/test_tune.py holds the refusal).
    rc, out = cli_json("tune", "-i", str(fleet), *TUNE, "--force", "--write")
    assert rc == ExitCode.OK, out
    # One class, measured on its first host; the other is not touched by the search.
    assert list(out["classes"].values()) == [[host, base_server.name]], out["classes"]
    assert list(out["results"]) == [host]
    assert ssh(base_server, "test -e /var/lib/provisioner/tune").returncode == 1
    assert etc_checksum(base_server) == etc_base
    result = out["results"][host]
    record = result["workloads"]["features"]["knobs"]["polars_threads"]
    rule = record["rule"]
    threads = int(out_of(server, "runuser -l ml -c 'echo $POLARS_MAX_THREADS'"))
    assert rule == threads == planned
    assert [c["value"] for c in record["candidates"]] == [v for v in range(1, threads + 1) if v != rule]
    # The model server's workers: every count whose workers x the plan's threads fit the cores.
    server_record = result["workloads"]["serving"]["knobs"]["serving_workers"]
    cores = result["cores"]
    assert server_record["rule"] == serving_planned["serving_workers"]
    fit = range(1, cores // serving_planned["serving_threads_per_worker"] + 1)
    assert [c["value"] for c in server_record["candidates"]] == [v for v in fit if v != server_record["rule"]]
    for first in (record["candidates"][0], server_record["candidates"][0]):
        assert first["ratios"] and all(len(f) == 2 and f["rule"] > 0 and f["candidate"] > 0 for f in first["figures"]), first
    # A pair begins only while the longest so far still fits the budget: over it by less than a pair.
    assert result["seconds"] <= BUDGET_S * 1.25, result["seconds"]
    # Each throwaway server stopped with its measurement, and its files went with the run.
    # ([p]: not the shell running the check.)
    left = "pgrep -f '[p]rovisioner_serve'; ls -d /var/tmp/provisioner-tune-* /data/provisioner-tune-* /tmp/provisioner-smoke-serve-* 2>/dev/null; true"
    assert out_of(server, left) == ""
    # Nothing on the host changed but the study it keeps.
    assert etc_checksum(server) == etc
    assert out_of(server, "ls /var/lib/provisioner/tune").split() == ["lock", "studies.db"]
    assert path.read_text() == USER_VARS  # the class's values go into its group, not a member's host_vars
    kept = {k: r["tuned"] for k, r in (("polars_threads", record), ("serving_workers", server_record)) if r["tuned"]}
    group_vars = sorted((fleet.parent / "group_vars").glob("hw_*.yml")) if (fleet.parent / "group_vars").exists() else []
    if not kept:
        assert group_vars == [] and not out["written"] and fleet.read_text() == listed
        return
    assert [str(p) for p in group_vars] == out["written"][:1] and out["written"][1:] == [str(fleet)]
    data = yaml.safe_load(group_vars[0].read_text())
    for knob, tuned in kept.items():
        assert data[f"plan_{knob}"] == tuned["value"]
        assert data["plan_tuned"][knob].endswith(f", measured on {host})")
    group = group_vars[0].stem
    edited = yaml.safe_load(fleet.read_text())
    assert list(edited[group]["hosts"]) == [host, base_server.name] and fleet.read_text().startswith(listed)
    # The plan reads the class's values for both members, with their evidence.
    rc, plans = cli_json("plan", "-i", str(fleet))
    assert rc == ExitCode.OK, plans
    for name in (host, base_server.name):
        settings = {s["key"]: s for s in plans[name]["settings"]}
        for knob, tuned in kept.items():
            assert settings[knob]["value"] == tuned["value"] and settings[knob]["reason"].startswith("tuned: "), settings[knob]


def test_a_tuned_value_in_host_vars_is_planned_with_its_evidence_and_up_applies_only_it(provisioned):
    """What tune --write leaves (an override and its evidence in host_vars): the plan gives the value
    that evidence as its reason, and the next up changes only the plan's record and thread_env's files."""
    server = provisioned["server"]
    inv = str(server.inventory)
    path = server.inventory.parent / "host_vars" / f"{server.name}.yml"
    path.parent.mkdir(exist_ok=True)
    omp = out_of(server, "runuser -l ml -c 'echo $OMP_NUM_THREADS'")
    evidence = "1.21x over the rule's 2 on features (11 pairs, spread 3%, 2026-12-04)"
    path.write_text(USER_VARS + f"plan_polars_threads: 1\nplan_tuned:\n  polars_threads: {evidence}\n")
    reason = {s["key"]: s["reason"] for s in plan_settings(server)}["polars_threads"]
    assert reason.startswith(f"tuned: {evidence}; 1: plan_polars_threads"), reason
    rc, up = cli_json("up", "-i", inv, "--no-smoke", "--no-verify", *provisioned["offline"])
    assert rc == ExitCode.OK, up
    assert up["hosts"][server.name]["changed"] > 0
    assert {c["task"] for c in up["changes"]} <= {"Record the applied plan on the target"} | THREAD_ENV_WRITES, up["changes"]
    assert out_of(server, "runuser -l ml -c 'echo $POLARS_MAX_THREADS $OMP_NUM_THREADS'") == f"1 {omp}"


THREAD_ENV_WRITES = {
    "Write the thread settings for login shells",
    "Write the thread settings for systemd user sessions",
    "Write the thread settings for systemd services (manager DefaultEnvironment)",
    "Write the thread settings ml-env reads",
    "Set the thread settings for PAM sessions (ssh commands, su, cron)",
    "Declare the expected state of thread_env",
}


def plan_settings(server) -> list[dict[str, Any]]:
    rc, data = cli_json("plan", "-i", str(server.inventory))
    assert rc == ExitCode.OK, data
    settings: list[dict[str, Any]] = data[server.name]["settings"]
    return settings


def plan_values(server) -> dict[str, Any]:
    return {s["key"]: s["value"] for s in plan_settings(server)}


# ---------------------------------------------------------------- status and drift


def timed_status(server, *args: str) -> tuple[int, dict, float]:
    started = time.monotonic()
    rc, data = cli_json("status", "-i", str(server.inventory), *args)
    return rc, data, time.monotonic() - started


def textfile_samples(server, name: str) -> dict[tuple[str, tuple], float]:
    """A textfile of the host's node_exporter directory, parsed with prometheus-client's parser."""
    r = ssh(server, f"cat /var/lib/prometheus/node-exporter/{name}")
    assert r.returncode == 0, r.stderr
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.stdout)
        for s in family.samples
    }


PROFILE_FILE = "/etc/profile.d/60-provisioner-threads.sh"
SYSCTL_FILE = "/etc/sysctl.d/60-provisioner-cpu.conf"
TUNED_DIR = "/etc/tuned/provisioner-ml"
# Our own files, broken as a package update or a hand edit would: the login profile exports
# 64 threads, swappiness 60 at boot, the tuned profile gone.
BREAK = (
    rf"sed -i -E 's/^: .\$\{{([A-Z_]+_NUM_THREADS):=[0-9]+\}}./\1=64/' {PROFILE_FILE}"
    f" && sed -i -E 's/^vm[.]swappiness = .*/vm.swappiness = 60/' {SYSCTL_FILE}"
    f" && rm -r {TUNED_DIR}"
    f" && grep -q '^OMP_NUM_THREADS=64; export' {PROFILE_FILE} && grep -q '^vm.swappiness = 60$' {SYSCTL_FILE}"
)


# A user's own file, read after the role's profile: it sets OMP_NUM_THREADS again (line 2), so
# the login shell's value is this file's, which `provisioner up` does not own.
USER_DRIFT_FILE = "/etc/profile.d/zz-drift.sh"
USER_DRIFT = "# a user's own setting\nexport OMP_NUM_THREADS=64\n"


@pytest.fixture(scope="module")
def drift(provisioned):
    """The converged server's status, then three settings broken by hand: status, the timer's
    textfile, the repair by `up` with the two roles' tags, and status again. The server is
    repaired whatever happens, for the tests after these."""
    server = provisioned["server"]
    inv = str(server.inventory)
    out: dict[str, Any] = {"clean": timed_status(server)}
    assert ssh(server, BREAK + f" && printf {shlex.quote(USER_DRIFT)} > {USER_DRIFT_FILE}").returncode == 0, (
        "the three settings were not broken"
    )
    try:
        out["drifted"] = timed_status(server)
        # The table as a pipe gets it (a test runner's own COLUMNS would narrow it).
        out["drifted_text"] = subprocess.run(
            [str(BIN), "status", "-i", inv], capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "1000"}
        )
        started = ssh(server, "systemctl start provisioner-status.service")
        out["timer"] = (started, textfile_samples(server, "provisioner_status.prom"))
        out["verify"] = cli_json("verify", "-i", inv, "--tags", "thread_env")
    finally:
        ssh(server, f"rm -f {USER_DRIFT_FILE}")  # not provisioner's: up would not remove it
        out["repair"] = cli_json("up", "-i", inv, "--tags", "cpu_tuning,thread_env", *provisioned["offline"])
    out["repaired"] = timed_status(server)
    return out


def test_status_of_a_converged_host_is_clean(provisioned, drift):
    host = provisioned["server"].name
    rc, out, wall = drift["clean"]
    assert rc == ExitCode.OK, out
    settings = out["hosts"][host]["settings"]
    assert [s for s in settings if s["state"] not in ("ok", "not applicable")] == []
    assert {s["role"] for s in settings} >= {"cpu_tuning", "thread_env", "mlstack"}
    names = {s["name"] for s in settings}
    assert {"swappiness", "tuned profile", "OMP_NUM_THREADS in a login shell of ml", "OMP_NUM_THREADS in a service"} <= names
    # A lab server is a container: the kernel knobs it cannot change are said so, each with why.
    assert all(s["reason"] for s in settings if s["state"] == "not applicable"), settings
    # Its speed is a figure (benchmarks/noop_rerun.py prints it), not a test's business.
    print(f"status on {host}: {wall:.1f} s wall, {out['run']['seconds']:.1f} s ansible, "
          f"{out['hosts'][host]['seconds']:.1f} s the script")


def by_name(out: dict, host: str) -> dict[str, dict]:
    return {s["name"]: s for s in out["hosts"][host]["settings"]}


def test_status_names_each_drifted_setting_with_both_values(provisioned, drift):
    host = provisioned["server"].name
    rc, out, _ = drift["drifted"]
    assert rc == ExitCode.HOST_FAILED, out
    settings = by_name(out, host)
    threads = provisioned["second"][1]["plan"][host]["values"]["threads_per_job"]
    login = settings["OMP_NUM_THREADS in a login shell of ml"]
    assert (login["state"], login["expected"], login["live"]) == ("drifted", str(threads), "64"), login
    assert settings["OMP_NUM_THREADS in a service"]["state"] == "ok", "the service's threads come from another file"
    swappiness = settings["swappiness"]
    assert swappiness["state"] == "drifted" and swappiness["expected"] != "60" and "60" in str(swappiness["live"]), swappiness
    tuned = settings["tuned profile"]
    assert tuned["state"] == "drifted" and tuned["expected"] == "provisioner-ml" and TUNED_DIR in tuned["reason"], tuned
    in_order = out["hosts"][host]["settings"]
    drifted = [s["name"] for s in in_order if s["state"] == "drifted"]
    assert [s["name"] for s in in_order[: len(drifted)]] == drifted, "drifted settings come first"
    assert {"swappiness", "tuned profile", "OMP_NUM_THREADS in a login shell of ml"} <= set(drifted)
    # The table says the same, and the note names the run that repairs it.
    text = drift["drifted_text"]
    assert text.returncode == ExitCode.HOST_FAILED
    row = next((ln for ln in text.stdout.splitlines() if "OMP_NUM_THREADS in a login shell" in ln), text.stdout)
    assert f" {threads} " in row and " 64 " in row and "drifted" in row, row
    # The doctor sees the login shell's 64 threads too: mlstack is named with the two roles.
    assert f"repair with: provisioner up --limit {host} --tags cpu_tuning,mlstack,thread_env" in text.stdout


def test_status_and_verify_name_the_users_file_that_sets_a_drifted_value(provisioned, drift):
    """OMP_NUM_THREADS comes from a user's /etc/profile.d/zz-drift.sh (line 2), after the role's
    own broken file: status names that file and says `provisioner up` cannot repair it; the other
    variables come from the role's file, which a run writes again. verify names it too."""
    host = provisioned["server"].name
    _, out, _ = drift["drifted"]
    settings = by_name(out, host)
    omp = settings["OMP_NUM_THREADS in a login shell of ml"]
    assert omp["source"] == {"file": USER_DRIFT_FILE, "line": 2, "managed_by_provisioner": False}, omp
    hint = f"set by {USER_DRIFT_FILE} line 2, not by provisioner: remove or change that line; `provisioner up` cannot repair it"
    assert omp["repair"] == hint
    mkl = settings["MKL_NUM_THREADS in a login shell of ml"]
    assert mkl["source"]["file"] == PROFILE_FILE and mkl["source"]["managed_by_provisioner"] is True and "repair" not in mkl
    text = drift["drifted_text"].stdout
    assert f"{host}: OMP_NUM_THREADS in a login shell of ml is {hint}" in text
    rc, verify = drift["verify"]
    assert rc == ExitCode.HOST_FAILED, verify
    failed = {c["check"]: c["message"] for c in verify["hosts"][host] if c["outcome"] == "failed"}
    message = failed.get("test_login_shell_of_the_ml_user_gets_the_threads", failed)
    assert f"OMP_NUM_THREADS=64 in a login shell of ml, expected {omp['expected']}: {hint}" in str(message), failed
    assert settings["ML stack doctor"]["state"] == "drifted" and "OMP_NUM_THREADS=64" in settings["ML stack doctor"]["reason"]


def test_the_timers_metrics_show_the_drift(provisioned, drift):
    started, samples = drift["timer"]
    assert started.returncode == 0, started.stderr

    def drifted(role: str, setting: str) -> float:
        return samples[("provisioner_setting_drifted", (("role", role), ("setting", setting)))]
    assert drifted("thread_env", "OMP_NUM_THREADS in a login shell of ml") == 1
    assert drifted("cpu_tuning", "swappiness") == 1
    assert drifted("cpu_tuning", "tuned profile") == 1
    assert drifted("thread_env", "OMP_NUM_THREADS in a service") == 0
    assert samples[("provisioner_settings_drifted", ())] >= 3
    assert time.time() - samples[("provisioner_status_last_run_timestamp_seconds", ())] < 600
    threads = provisioned["second"][1]["plan"][provisioned["server"].name]["values"]["threads_per_job"]
    assert samples[("provisioner_plan_value", (("key", "threads_per_job"),))] == threads


def test_up_repairs_the_drift_and_status_is_clean_again(provisioned, drift):
    """`up --tags cpu_tuning,thread_env`: the plan still runs (the roles' defaults read it), the
    two roles repair what was broken, verify runs their checks only, the smoke test is left out."""
    host = provisioned["server"].name
    rc, out = drift["repair"]
    assert rc == ExitCode.OK, out
    assert out["hosts"][host]["changed"] > 0 and out["smoke"] is None
    assert out["plan"][host]["values"]["threads_per_job"] >= 1
    checks = out["verify"]["hosts"][host]
    assert [c for c in checks if c["outcome"] not in ("passed", "skipped")] == [], checks
    assert {c["role"] for c in checks} == {"cpu_tuning", "thread_env"}, checks
    rc, out, _ = drift["repaired"]
    assert rc == ExitCode.OK, out
    assert by_name(out, host)["tuned profile"]["state"] == "ok"


def test_the_smoke_figures_reach_node_exporter(provisioned, drift):
    """`up` ended with the smoke test: its figures were copied to the textfile directory, and
    node_exporter serves them with both textfiles' mtimes."""
    samples = textfile_samples(provisioned["server"], "provisioner_smoke.prom")
    # The last smoke run was the regression test's (DGEMM only): its status is there.
    assert any(k[0] == "provisioner_smoke_status" and ("check", "compute.dgemm_one") in k[1] for k in samples), samples
    assert samples[("provisioner_smoke_last_run_timestamp_seconds", ())] > 0
    r = ssh(provisioned["server"], "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9100/metrics').read().decode())\"")
    assert r.returncode == 0, r.stderr
    served = {s.name for f in text_string_to_metric_families(r.stdout) for s in f.samples}
    assert {"provisioner_smoke_figure", "provisioner_setting_drifted", "node_textfile_mtime_seconds"} <= served


def test_undo_restores_packages_units_and_users(provisioned, drift):
    """The module's last run: undo after everything above (drift and its repair included)."""
    server = provisioned["server"]
    rc, _ = cli_json("undo", "-i", str(server.inventory))
    assert rc == ExitCode.OK
    # The ML environment the run made goes with every generation of it.
    assert out_of(server, "ls -d /opt/mlstack /opt/mlstack-envs 2>/dev/null; true").strip() == ""
    after = snapshot(server)
    before = provisioned["before"]
    added = after["packages"] - before["packages"]
    assert {p.split()[-1] for p in added} <= KEPT_PACKAGES, f"packages the run added and undo left: {sorted(added)}"
    assert before["packages"] <= after["packages"], f"packages undo took: {sorted(before['packages'] - after['packages'])}"
    assert after["units"] == before["units"], (sorted(after["units"] - before["units"]), sorted(before["units"] - after["units"]))
    assert after["users"] == before["users"], (sorted(after["users"] - before["users"]), sorted(before["users"] - after["users"]))
    assert after["groups"] == before["groups"], (
        sorted(after["groups"] - before["groups"]),
        sorted(before["groups"] - after["groups"]),
    )
