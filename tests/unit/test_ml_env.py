"""ml-env (roles/thread_env/files/ml-env): the thread split, refusals, pin sets, exit status and
signal forwarding, from its functions and by running it for real with small commands."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ML_ENV = ROOT / "roles" / "thread_env" / "files" / "ml-env"


def _load():
    loader = SourceFileLoader("ml_env", str(ML_ENV))
    spec = importlib.util.spec_from_loader("ml_env", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


ml_env = _load()


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return subprocess.run(
        [sys.executable, str(ML_ENV), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**base, **(env or {})},
    )


def lines(out: str) -> list[str]:
    return sorted(line for line in out.splitlines() if line.strip())


def fake_sysfs(root: Path, cores: int, smt: int, packages: int = 1) -> Path:
    """/sys/devices/system/cpu with `cores` cores per package and `smt` threads per core, numbered
    like Linux does (all first threads, then the siblings)."""
    total = cores * smt * packages
    (root / "online").parent.mkdir(parents=True, exist_ok=True)
    (root / "online").write_text(f"0-{total - 1}\n")
    for cpu in range(total):
        _thread, rest = divmod(cpu, cores * packages)
        package, core = divmod(rest, cores)
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "die_id").write_text("0\n")
        (topo / "core_id").write_text(f"{core}\n")
    return root


# --------------------------------------------------------------------------
# the split
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "trials", "threads"),
    [(16, 1, 16), (16, 16, 1), (16, 4, 4), (16, 3, 5), (16, 5, 3), (2, 2, 1), (2, 4, 1), (1, 1, 1)],
)
def test_threads_per_trial_are_cores_divided_by_trials(cores, trials, threads):
    assert ml_env.split_threads(cores, trials) == threads


def test_more_trials_than_cores_refused_unless_oversubscribe():
    with pytest.raises(ml_env.UsageError, match="--oversubscribe"):
        ml_env.check_trials(16, 17, oversubscribe=False, pin=False, pinnable=16)
    ml_env.check_trials(16, 17, oversubscribe=True, pin=False, pinnable=16)
    ml_env.check_trials(16, 16, oversubscribe=False, pin=False, pinnable=16)


def test_pin_needs_a_core_per_trial():
    with pytest.raises(ml_env.UsageError, match="--pin"):
        ml_env.check_trials(16, 9, oversubscribe=False, pin=True, pinnable=8)


@pytest.mark.parametrize("bad", ["0", "-3", "x"])
def test_bad_trials_refused(bad):
    with pytest.raises(ml_env.UsageError, match="--trials"):
        ml_env.resolve_trials(bad, {})


def test_trials_plan_reads_the_thread_settings():
    assert ml_env.resolve_trials("plan", {"trials": "16"}) == 16
    assert ml_env.resolve_trials(None, {"trials": "16"}) == 1
    with pytest.raises(ml_env.UsageError):
        ml_env.resolve_trials("plan", {})


def test_cores_from_the_thread_settings_capped_to_the_cores_available():
    topology = [[0], [1], [2], [3]]
    assert ml_env.resolve_cores(None, {"cores": "4"}, topology)[0] == 4
    assert ml_env.resolve_cores(None, {"cores": "2"}, topology)[0] == 2
    cores, source = ml_env.resolve_cores(None, {"cores": "16"}, topology)
    assert cores == 4 and "capped" in source
    assert ml_env.resolve_cores(None, {}, topology)[0] == 4
    assert ml_env.resolve_cores(16, {"cores": "2"}, topology) == (16, "--cores")
    with pytest.raises(ml_env.UsageError):
        ml_env.resolve_cores(None, {"cores": "0"}, topology)


# --------------------------------------------------------------------------
# topology and pin sets
# --------------------------------------------------------------------------


def test_physical_cores_group_smt_siblings(tmp_path):
    sysfs = fake_sysfs(tmp_path / "cpu", cores=4, smt=2)
    assert ml_env.physical_cores(sysfs, allowed=set(range(8))) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # The affinity mask decides what is available: a core counts with any allowed sibling.
    assert ml_env.physical_cores(sysfs, allowed={0, 1, 4}) == [[0, 4], [1]]


def test_physical_cores_tell_packages_apart(tmp_path):
    sysfs = fake_sysfs(tmp_path / "cpu", cores=2, smt=1, packages=2)
    assert ml_env.physical_cores(sysfs, allowed={0, 1, 2, 3}) == [[0], [1], [2], [3]]


def test_pin_sets_are_disjoint_whole_cores(tmp_path):
    topology = ml_env.physical_cores(fake_sysfs(tmp_path / "cpu", cores=16, smt=2), allowed=set(range(32)))
    sets = ml_env.pin_sets(topology, trials=4, threads=4)
    assert sets[0] == [0, 16, 1, 17, 2, 18, 3, 19]
    assert [len(s) for s in sets] == [8, 8, 8, 8]
    flat = [cpu for s in sets for cpu in s]
    assert len(flat) == len(set(flat)) == 32
    # 16 trials on 16 cores (the seed workload): one core, both siblings, each.
    assert ml_env.pin_sets(topology, trials=16, threads=1)[5] == [5, 21]


def test_pinned_plan_sets_binding_only_for_its_own_process():
    topology = [[i] for i in range(8)]
    plan = ml_env.plan_trials(3, 8, True, topology, {}, {})
    assert [cpus for _env, cpus in plan] == [[0, 1], [2, 3], [4, 5]]
    for env, cpus in plan:
        assert env["OMP_NUM_THREADS"] == "2" == env["ML_ENV_THREADS"]
        assert env["OMP_PROC_BIND"] == "close" and env["OMP_PLACES"] == "cores"
        assert env["ML_ENV_CPUS"] == ml_env.format_cpu_list(cpus)


def test_unpinned_trials_drop_inherited_pinning_variables():
    base = {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores", "GOMP_CPU_AFFINITY": "0-3", "HOME": "/root"}
    many = ml_env.trial_env(base, 0, 4, 4, {})
    assert not {"OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY"} & set(many)
    assert many["HOME"] == "/root"
    # One job is the user's own business.
    assert ml_env.trial_env(base, 0, 1, 16, {})["OMP_PROC_BIND"] == "close"


def test_kmp_variables_only_for_intel_openmp():
    libiomp = {"openmp_runtime": "libiomp", "kmp_blocktime": "1", "kmp_affinity": "granularity=core,none"}
    env = ml_env.trial_env({}, 0, 2, 8, libiomp)
    assert env["KMP_BLOCKTIME"] == "1" and env["KMP_AFFINITY"] == "granularity=core,none"
    pinned = ml_env.trial_env({"KMP_AFFINITY": "granularity=core,none"}, 0, 2, 8, libiomp, cpus=[0, 1])
    assert "KMP_AFFINITY" not in pinned  # would take precedence over OMP_PROC_BIND/OMP_PLACES
    assert not {"KMP_BLOCKTIME", "KMP_AFFINITY"} & set(ml_env.trial_env({}, 0, 2, 8, {"openmp_runtime": "libgomp"}))


@pytest.mark.parametrize(
    ("value", "threads", "cores", "floor", "share"),
    [
        (8, 4, 16, 1, 2),
        (8, 1, 16, 1, 1),
        (2, 32, 64, 1, 1),
        (2, 64, 64, 1, 2),
        (4, 1, 16, 0, 0),
        (4, 8, 16, 0, 2),
        (12, 4, 16, 1, 3),
    ],
)
def test_scaled_counts_get_the_trials_share_of_the_machine(value, threads, cores, floor, share):
    assert ml_env.scaled_share(value, threads, cores, floor) == share


def test_every_trial_gets_its_share_of_the_scaled_counts():
    config = {
        "cores": "16",
        "variables": "OMP_NUM_THREADS POLARS_MAX_THREADS",
        "scaled": "ARROW_IO_THREADS=8 PROVISIONER_DATALOADER_WORKERS=4 PROVISIONER_DATALOADER_THREADS=12",
        "zero_floor": "PROVISIONER_DATALOADER_WORKERS",
        "fixed": "TF_ENABLE_ONEDNN_OPTS=1",
    }
    topology = [[i] for i in range(16)]
    for trials, expected in [(1, ("16", "8", "4", "12")), (4, ("4", "2", "1", "3")), (16, ("1", "1", "0", "1"))]:
        for env, _ in ml_env.plan_trials(trials, 16, False, topology, config, {}):
            got = tuple(
                env[n]
                for n in (
                    "POLARS_MAX_THREADS",
                    "ARROW_IO_THREADS",
                    "PROVISIONER_DATALOADER_WORKERS",
                    "PROVISIONER_DATALOADER_THREADS",
                )
            )
            assert got == expected, trials
            assert env["TF_ENABLE_ONEDNN_OPTS"] == "1"
    shown = ml_env.shown_keys(ml_env.trial_env({}, 0, 2, 8, config), config)
    assert {"ARROW_IO_THREADS", "PROVISIONER_DATALOADER_WORKERS", "TF_ENABLE_ONEDNN_OPTS"} <= set(shown)


def test_one_job_on_fewer_cores_than_configured_gets_the_same_fraction():
    config = {"cores": "16", "scaled": "ARROW_IO_THREADS=8"}
    assert ml_env.trial_env({}, 0, 1, 4, config)["ARROW_IO_THREADS"] == "2"


def test_cpu_lists_round_trip():
    assert ml_env.parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert ml_env.format_cpu_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


def test_config_file(tmp_path):
    conf = tmp_path / "threads.conf"
    conf.write_text('# comment\ncores=16\ntrials=16\nvariables="OMP_NUM_THREADS MKL_NUM_THREADS"\n')
    assert ml_env.read_config(conf) == {"cores": "16", "trials": "16", "variables": "OMP_NUM_THREADS MKL_NUM_THREADS"}
    assert ml_env.read_config(tmp_path / "absent") == {}


# --------------------------------------------------------------------------
# for real, as a subprocess
# --------------------------------------------------------------------------


def test_trials_run_in_parallel_with_their_share():
    r = run(
        "--cores",
        "16",
        "--trials",
        "4",
        "--",
        "sh",
        "-c",
        "echo $ML_ENV_TRIAL $ML_ENV_TRIALS $OMP_NUM_THREADS $MKL_NUM_THREADS $OPENBLAS_NUM_THREADS $NUMEXPR_NUM_THREADS",
    )
    assert r.returncode == 0, r.stderr
    assert lines(r.stdout) == [f"{i} 4 4 4 4 4" for i in range(4)]


def test_seed_workload_sixteen_trials_on_sixteen_cores():
    r = run("--cores", "16", "--trials", "16", "--", "sh", "-c", "echo $ML_ENV_TRIAL $OMP_NUM_THREADS")
    assert r.returncode == 0, r.stderr
    assert lines(r.stdout) == sorted(f"{i} 1" for i in range(16))


def test_one_job_gets_all_cores_and_becomes_the_command():
    r = run("--cores", "8", "--", "sh", "-c", "echo $ML_ENV_TRIAL $ML_ENV_TRIALS $OMP_NUM_THREADS; exit 5")
    assert r.stdout.strip() == "0 1 8"
    assert r.returncode == 5 and r.stderr == ""  # exec: the command's own status, no report


def test_thread_settings_file_is_the_source_of_cores(tmp_path):
    conf = tmp_path / "threads.conf"
    conf.write_text("cores=1\ntrials=1\n")
    r = run("--config", str(conf), "--", "sh", "-c", "echo $OMP_NUM_THREADS")
    assert (r.returncode, r.stdout.strip()) == (0, "1")
    r = run("--config", str(conf), "--print")
    assert r.stdout.startswith("# cores=1 (thread settings)")


def test_refuses_more_trials_than_cores_in_one_line(tmp_path):
    marker = tmp_path / "ran"
    r = run("--cores", "2", "--trials", "3", "--", "touch", str(marker))
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "--oversubscribe" in r.stderr
    assert not marker.exists()


def test_oversubscribe_allows_it_with_one_thread_each():
    r = run("--cores", "2", "--trials", "3", "--oversubscribe", "--", "sh", "-c", "echo $ML_ENV_TRIAL $OMP_NUM_THREADS")
    assert r.returncode == 0, r.stderr
    assert lines(r.stdout) == ["0 1", "1 1", "2 1"]


def test_failing_trial_makes_the_exit_status_and_is_named():
    r = run("--cores", "4", "--trials", "3", "--", "sh", "-c", "exit $((ML_ENV_TRIAL == 1 ? 3 : 0))")
    assert r.returncode == 3
    assert "trial 1 of 3 exited with 3" in r.stderr
    assert "trial 0" not in r.stderr and "trial 2 " not in r.stderr


def test_killed_trial_reports_the_signal():
    r = run("--cores", "2", "--trials", "2", "--", "sh", "-c", 'if [ "$ML_ENV_TRIAL" = 1 ]; then kill -KILL $$; fi')
    assert r.returncode == 128 + signal.SIGKILL
    assert "trial 1 of 2 was killed by SIGKILL" in r.stderr


def test_all_trials_succeed_exit_zero():
    assert run("--cores", "2", "--trials", "2", "--", "true").returncode == 0


def test_no_command_is_a_usage_error():
    r = run("--trials", "2")
    assert r.returncode == 2 and "no command" in r.stderr


def test_missing_command():
    r = run("--cores", "2", "--trials", "2", "--", "no-such-command-ml-env")
    assert r.returncode == 127 and "command not found" in r.stderr


def test_print_shows_each_trial_and_runs_nothing():
    r = run("--cores", "16", "--trials", "4", "--print", "--", "false")
    assert r.returncode == 0
    out = r.stdout.splitlines()
    assert out[0] == "# cores=16 (--cores) trials=4 threads_per_trial=4"
    assignments = [dict(a.split("=", 1) for a in line.split()) for line in out if not line.startswith("#")]
    assert [a["ML_ENV_TRIAL"] for a in assignments] == ["0", "1", "2", "3"]
    assert all(a["OMP_NUM_THREADS"] == "4" and "OMP_PROC_BIND" not in a for a in assignments)


def test_inherited_pinning_is_not_passed_to_parallel_trials():
    r = run(
        "--cores",
        "2",
        "--trials",
        "2",
        "--",
        "sh",
        "-c",
        'echo "[$OMP_PROC_BIND][$OMP_PLACES]"',
        env={"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"},
    )
    assert lines(r.stdout) == ["[][]", "[][]"]


@pytest.mark.skipif(len(ml_env.physical_cores()) < 2, reason="needs 2 physical cores in this process's affinity")
def test_pin_gives_each_trial_its_own_cores():
    code = "import os; print(os.environ['ML_ENV_TRIAL'], os.environ['OMP_PROC_BIND'], os.environ['OMP_PLACES'], sorted(os.sched_getaffinity(0)))"
    r = run("--trials", "2", "--pin", "--", sys.executable, "-c", code)
    assert r.returncode == 0, r.stderr
    rows = [line.split(" ", 3) for line in lines(r.stdout)]
    assert [row[:3] for row in rows] == [["0", "close", "cores"], ["1", "close", "cores"]]
    first, second = (set(eval(row[3])) for row in rows)  # our own printed lists
    assert first and second and not first & second


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_are_forwarded_to_every_trial(tmp_path, sig):
    code = (
        "import os, signal, sys, time\n"
        "d = sys.argv[1]; t = os.environ['ML_ENV_TRIAL']\n"
        "def bye(n, f):\n"
        "    open(os.path.join(d, 'got-' + t), 'w').write(str(n)); sys.exit(7)\n"
        "signal.signal(signal.SIGTERM, bye); signal.signal(signal.SIGINT, bye)\n"
        "open(os.path.join(d, 'ready-' + t), 'w').close()\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(ML_ENV), "--cores", "2", "--trials", "2", "--", sys.executable, "-c", code, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while not all((tmp_path / f"ready-{i}").exists() for i in range(2)):
        assert time.monotonic() < deadline, "trials did not start"
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    started = time.monotonic()
    proc.send_signal(sig)
    _out, err = proc.communicate(timeout=20)
    assert time.monotonic() - started < 10
    assert proc.returncode == 7, err
    assert sorted(p.name for p in tmp_path.glob("got-*")) == ["got-0", "got-1"]
    assert all((tmp_path / f"got-{i}").read_text() == str(int(sig)) for i in range(2))


def test_script_runs_by_its_shebang():
    if not Path("/usr/bin/python3").exists():
        pytest.skip("no /usr/bin/python3")
    r = subprocess.run(
        [str(ML_ENV), "--cores", "2", "--", "sh", "-c", "echo $OMP_NUM_THREADS"], capture_output=True, text=True, timeout=30
    )
    assert (r.returncode, r.stdout.strip()) == (0, "2")


# --------------------------------------------------------------------------
# the ML environment on PATH, and the count joblib's workers split
# --------------------------------------------------------------------------


def test_every_trial_carries_the_count_its_variables_hold():
    """PROVISIONER_THREADS = the trial's threads: the ML environment's start-up hook divides
    exactly that among a trial's joblib workers (and leaves a variable set to anything else)."""
    runs = ml_env.plan_trials(4, 16, False, [[c] for c in range(16)], {"cores": "16"}, {"PROVISIONER_THREADS": "16"})
    assert {env["PROVISIONER_THREADS"] for env, _ in runs} == {"4"}
    assert all(env["OMP_NUM_THREADS"] == env["PROVISIONER_THREADS"] for env, _ in runs)
    one = ml_env.trial_env({}, 0, 1, 16, {"cores": "16"})
    assert one["PROVISIONER_THREADS"] == "16"
    assert "PROVISIONER_THREADS" in ml_env.shown_keys(one, {})


def test_the_ml_environment_comes_first_on_the_commands_path(tmp_path):
    bindir = tmp_path / "mlstack" / "bin"
    bindir.mkdir(parents=True)
    config = {"path": str(bindir)}
    env = ml_env.with_ml_path({"PATH": "/usr/local/bin:/usr/bin:/bin"}, config)
    assert env["PATH"] == f"{bindir}:/usr/local/bin:/usr/bin:/bin"
    # Already on PATH further back: moved to the front, not repeated.
    again = ml_env.with_ml_path({"PATH": f"/usr/bin:{bindir}:/bin"}, config)
    assert again["PATH"] == f"{bindir}:/usr/bin:/bin"
    # No PATH at all: the system's default search path after it.
    assert ml_env.with_ml_path({}, config)["PATH"] == ":".join([str(bindir), *(p for p in os.defpath.split(":") if p)])


def test_a_venv_the_caller_activated_and_a_missing_environment_leave_path_alone(tmp_path):
    bindir = tmp_path / "mlstack" / "bin"
    bindir.mkdir(parents=True)
    base = {"PATH": "/home/u/venv/bin:/usr/bin", "VIRTUAL_ENV": "/home/u/venv"}
    assert ml_env.with_ml_path(base, {"path": str(bindir)}) == base
    # Activated the ML environment itself: it is put first all the same.
    own = {"PATH": "/usr/bin", "VIRTUAL_ENV": str(bindir.parent)}
    assert ml_env.with_ml_path(own, {"path": str(bindir)})["PATH"] == f"{bindir}:/usr/bin"
    plain = {"PATH": "/usr/bin"}
    assert ml_env.with_ml_path(plain, {"path": str(tmp_path / "absent" / "bin")}) == plain
    assert ml_env.with_ml_path(plain, {}) == plain


def test_python_resolves_to_the_ml_environment_inside_ml_env(tmp_path):
    """For real: `ml-env --trials 2 -- python ...` runs the ML environment's python, found on the
    PATH ml-env gives the command (here a stand-in environment whose python says who it is)."""
    bindir = tmp_path / "mlstack" / "bin"
    bindir.mkdir(parents=True)
    fake = bindir / "python"
    fake.write_text('#!/bin/sh\necho "mlstack $ML_ENV_TRIAL $PROVISIONER_THREADS"\n')
    fake.chmod(0o755)
    conf = tmp_path / "threads.conf"
    conf.write_text(f"cores=4\ntrials=2\npath={bindir}\n")
    r = run("--config", str(conf), "--cores", "4", "--trials", "2", "--", "python", "-c", "pass",
            env={"PATH": "/usr/local/bin:/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["mlstack 0 2", "mlstack 1 2"]
    plain = run("--config", str(conf), "--cores", "4", "--", "sh", "-c", "command -v python",
                env={"PATH": "/usr/local/bin:/usr/bin:/bin"})
    assert plain.stdout.strip() == str(fake), plain.stderr
