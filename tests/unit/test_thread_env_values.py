"""Role thread_env's values from the plan, on the four hardware fixtures: its defaults and vars
rendered as Ansible renders them, the threads.conf it writes, and what ml-env gives N trials
from that file (each its share of every count; DataLoader workers + threads within its cores)."""

from __future__ import annotations

import os
from pathlib import Path

import jinja2
import pytest
import yaml
from facts_fixtures import load

from provisioner.checks import _ansible_filters, _render
from provisioner.plan import PlanOptions, derive_plan
from tests.unit.test_ml_env import ml_env

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "thread_env"
MACHINES = ("epyc_4545p", "xeon_2s", "vm_2vcpu", "laptop_4c")
# exported variable -> the plan value it carries
FROM_PLAN = {
    "OMP_NUM_THREADS": "threads_per_job",
    "POLARS_MAX_THREADS": "polars_threads",
    "TF_NUM_INTRAOP_THREADS": "tf_intra_op_threads",
    "LOKY_MAX_CPU_COUNT": "joblib_workers",
    "ARROW_IO_THREADS": "arrow_io_threads",
    "TF_NUM_INTEROP_THREADS": "tf_inter_op_threads",
    "PROVISIONER_TORCH_INTEROP_THREADS": "torch_interop_threads",
    "PROVISIONER_DATALOADER_WORKERS": "dataloader_workers",
    "PROVISIONER_DATALOADER_THREADS": "dataloader_threads",
}


def role_values(plan: dict, overrides: dict | None = None, play: dict | None = None) -> dict:
    """The role's defaults and vars rendered against PLAN, as a play would see them (PLAY: the
    play's other variables, plan_* among them)."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    variables = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    merged = {**defaults, **(overrides or {}), **variables}
    return _render(merged, {**(play or {}), "provisioner_plan": plan, "ansible_facts": {"processor_count": 1}})


def threads_conf(values: dict) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters.update(_ansible_filters())
    return env.from_string((ROLE / "templates" / "threads.conf.j2").read_text()).render(values)


def plan_of(machine: str, **options) -> dict:
    facts = load(machine)
    return derive_plan(facts, PlanOptions(**options)).to_dict()


@pytest.mark.parametrize("machine", MACHINES)
def test_every_runtime_variable_carries_its_plan_value(machine):
    plan = plan_of(machine)
    exported = role_values(plan)["_thread_env_values"]
    assert {name: exported[name] for name in FROM_PLAN} == {name: str(plan["values"][key]) for name, key in FROM_PLAN.items()}
    assert exported["TF_ENABLE_ONEDNN_OPTS"] == "1"
    assert not {"OMP_PROC_BIND", "OMP_PLACES", "KMP_AFFINITY", "KMP_BLOCKTIME"} & set(exported)


def test_onednn_switch_off_exports_nothing():
    exported = role_values(plan_of("vm_2vcpu"), {"thread_env_tf_onednn": False})["_thread_env_values"]
    assert "TF_ENABLE_ONEDNN_OPTS" not in exported


def test_another_thread_count_gets_the_dataloader_rule_on_it():
    """thread_env_threads below the plan's cores: the DataLoader split follows it, not the plan."""
    values = role_values(plan_of("epyc_4545p"), {"thread_env_threads": 8})
    assert (values["thread_env_dataloader_workers"], values["thread_env_dataloader_threads"]) == (2, 6)
    one = role_values(plan_of("epyc_4545p"), {"thread_env_threads": 1})
    assert (one["thread_env_dataloader_workers"], one["thread_env_dataloader_threads"]) == (0, 1)


def test_without_a_plan_the_role_uses_the_same_rules():
    values = role_values({}, {"thread_env_threads": 4})
    assert values["thread_env_arrow_io_threads"] == 8
    assert values["thread_env_tf_inter_op_threads"] == 1
    assert (values["thread_env_dataloader_workers"], values["thread_env_dataloader_threads"]) == (1, 3)


def splits() -> list[tuple[str, int]]:
    """(machine, trials) for 1, 2, 4 and 16 trials where the machine has that many cores."""
    out = []
    for machine in MACHINES:
        cores = load(machine)["cpu"]["cores"]
        out += [(machine, trials) for trials in (1, 2, 4, 16) if trials <= cores]
    return out


@pytest.mark.parametrize(("machine", "trials"), splits())
def test_ml_env_gives_each_trial_its_share_of_every_count(tmp_path, machine, trials):
    plan = plan_of(machine)
    cores = plan["values"]["threads_per_job"]
    conf = tmp_path / "threads.conf"
    conf.write_text(threads_conf(role_values(plan)))
    config = ml_env.read_config(conf)
    topology = [[cpu] for cpu in range(cores)]
    runs = ml_env.plan_trials(trials, cores, False, topology, config, {})
    per_trial = cores // trials
    for env, _cpus in runs:
        for name in ("OMP_NUM_THREADS", "POLARS_MAX_THREADS", "TF_NUM_INTRAOP_THREADS", "LOKY_MAX_CPU_COUNT"):
            assert env[name] == str(per_trial), name
        for name in ("ARROW_IO_THREADS", "TF_NUM_INTEROP_THREADS", "PROVISIONER_TORCH_INTEROP_THREADS"):
            value = plan["values"][FROM_PLAN[name]]
            assert env[name] == str(max(1, value * per_trial // cores)), name
        workers = int(env["PROVISIONER_DATALOADER_WORKERS"])
        threads = int(env["PROVISIONER_DATALOADER_THREADS"])
        assert workers >= 0 and threads >= 1
        assert workers + threads <= per_trial
        if trials == 1:
            assert (workers, threads) == (plan["values"]["dataloader_workers"], plan["values"]["dataloader_threads"])
        assert env["TF_ENABLE_ONEDNN_OPTS"] == "1"
    # The whole machine's IO pool is never multiplied by the trials beyond one thread each.
    total_io = sum(int(env["ARROW_IO_THREADS"]) for env, _ in runs)
    assert total_io <= max(plan["values"]["arrow_io_threads"], trials)


def test_fixed_values_leave_a_users_own_choice():
    config = {"cores": "4", "fixed": "TF_ENABLE_ONEDNN_OPTS=1"}
    assert ml_env.trial_env({"TF_ENABLE_ONEDNN_OPTS": "0"}, 0, 1, 4, config)["TF_ENABLE_ONEDNN_OPTS"] == "0"
    assert ml_env.trial_env({}, 0, 1, 4, config)["TF_ENABLE_ONEDNN_OPTS"] == "1"


def test_a_bad_scaled_value_is_a_usage_error():
    with pytest.raises(ml_env.UsageError, match="ARROW_IO_THREADS"):
        ml_env.trial_env({}, 0, 1, 4, {"cores": "4", "scaled": "ARROW_IO_THREADS=many"})


def test_ml_env_prints_the_shares_from_a_rendered_threads_conf(tmp_path):
    """For real: ml-env reads the file the role writes and prints every trial's counts."""
    import subprocess
    import sys

    conf = tmp_path / "threads.conf"
    conf.write_text(threads_conf(role_values(plan_of("epyc_4545p"))))
    r = subprocess.run(
        [sys.executable, str(ROLE / "files" / "ml-env"), "--config", str(conf), "--cores", "16", "--trials", "4", "--print"],
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    rows = [dict(a.split("=", 1) for a in line.split()) for line in r.stdout.splitlines() if not line.startswith("#")]
    assert len(rows) == 4
    for row in rows:
        assert row["OMP_NUM_THREADS"] == row["POLARS_MAX_THREADS"] == "4"
        assert (row["PROVISIONER_DATALOADER_WORKERS"], row["PROVISIONER_DATALOADER_THREADS"]) == ("1", "3")
        assert row["ARROW_IO_THREADS"] == "2" and row["PROVISIONER_TORCH_INTEROP_THREADS"] == "1"


# --------------------------------------------------------------------------
# PROVISIONER_THREADS and the ML environment's start-up hook for joblib's workers
# --------------------------------------------------------------------------

HOOK_DIR = ROOT / "roles" / "mlstack" / "files"


def _hook():
    import importlib.util as iu

    spec = iu.spec_from_file_location("provisioner_threads_under_test", HOOK_DIR / "provisioner_threads.py")
    assert spec is not None and spec.loader is not None
    module = iu.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = _hook()


@pytest.mark.parametrize("machine", MACHINES)
def test_the_marker_names_the_count_every_thread_variable_carries(tmp_path, machine):
    plan = plan_of(machine)
    values = role_values(plan)
    exported = values["_thread_env_values"]
    threads = str(plan["values"]["threads_per_job"])
    assert exported["PROVISIONER_THREADS"] == threads
    assert all(exported[name] == threads for name in values["thread_env_variables"])
    # Recorded in kernelspecs, so undo restores them; ml-env finds the ML environment's bin.
    assert "PROVISIONER_THREADS" in values["_thread_env_record_names"]
    conf = ml_env.read_config(_write(tmp_path, threads_conf(values)))
    assert conf["path"] == "/opt/mlstack/bin"
    other = role_values(plan, {"mlstack_venv": "/srv/ml"})
    assert ml_env.read_config(_write(tmp_path, threads_conf(other)))["path"] == "/srv/ml/bin"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "threads.conf"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("machine", "trials"), splits())
def test_each_joblib_worker_gets_what_ml_env_gives_a_trial(tmp_path, machine, trials):
    """The hook's rule is ml-env's: a process with the exported values, n_jobs workers -> each
    worker has what `ml-env --trials n_jobs` gives each trial, for every variable and count."""
    plan = plan_of(machine)
    values = role_values(plan)
    cores = plan["values"]["threads_per_job"]
    settings = hook.read_settings(str(_write(tmp_path, threads_conf(values))))
    environ = dict(values["_thread_env_values"])
    joblib_env = {"OMP_NUM_THREADS": environ["OMP_NUM_THREADS"], "BLIS_NUM_THREADS": "7"}  # as joblib leaves them
    worker = hook.worker_env(joblib_env, environ, trials, settings, ("OMP_NUM_THREADS", "BLIS_NUM_THREADS"))
    trial, _cpus = ml_env.plan_trials(trials, cores, False, [[c] for c in range(cores)], ml_env.read_config(
        _write(tmp_path, threads_conf(values))), {})[0]
    for name in [*values["thread_env_variables"], *values["_thread_env_scaled"], "PROVISIONER_THREADS"]:
        assert worker[name] == trial[name], name
    assert worker["BLIS_NUM_THREADS"] == "7"  # not one of provisioner's: joblib's own value stays


def test_a_value_the_user_set_and_an_explicit_limit_stay_as_joblib_makes_them():
    environ = {"PROVISIONER_THREADS": "8", "OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "8", "POLARS_MAX_THREADS": "8"}
    joblib_env = {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "8"}
    worker = hook.worker_env(joblib_env, environ, 4, {}, ("OMP_NUM_THREADS", "MKL_NUM_THREADS"))
    assert worker["OMP_NUM_THREADS"] == "3", "the user's own value was changed"
    assert (worker["MKL_NUM_THREADS"], worker["POLARS_MAX_THREADS"], worker["PROVISIONER_THREADS"]) == ("2", "2", "2")
    # No marker (unset, or a process outside provisioner's sessions): joblib's behaviour, untouched.
    assert hook.worker_env(joblib_env, {"OMP_NUM_THREADS": "8"}, 4, {}, ()) == joblib_env
    assert hook.worker_env(joblib_env, {"PROVISIONER_THREADS": "x", "OMP_NUM_THREADS": "8"}, 4, {}, ()) == joblib_env
    # More workers than threads: one thread each, never 0.
    assert hook.worker_env({}, {"PROVISIONER_THREADS": "2", "OMP_NUM_THREADS": "2"}, 8, {}, ())["OMP_NUM_THREADS"] == "1"


def test_the_hook_wraps_joblib_once_and_keeps_inner_max_num_threads():
    class Base:
        MAX_NUM_THREADS_VARS = ("OMP_NUM_THREADS",)
        inner_max_num_threads = None

        def _prepare_worker_env(self, n_jobs):
            return {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}

    class Module:
        ParallelBackendBase = Base

    assert hook.patch(Module) is True and hook.patch(Module) is False
    saved = {k: os.environ.get(k) for k in ("PROVISIONER_THREADS", "OMP_NUM_THREADS")}
    os.environ.update({"PROVISIONER_THREADS": "4", "OMP_NUM_THREADS": "4"})
    try:
        assert Base()._prepare_worker_env(2)["OMP_NUM_THREADS"] == "2"
        explicit = Base()
        explicit.inner_max_num_threads = 3
        assert explicit._prepare_worker_env(2) == {"OMP_NUM_THREADS": "4"}
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


GRID_PROBE = """
import json, os, site, sys
if sys.argv[1] == "hook":
    site.addsitedir(sys.argv[2])  # reads provisioner_threads.pth as the ML environment's site-packages does
from joblib import Parallel, delayed

def probe(i):  # a task's view from inside its loky worker, as a scorer of GridSearchCV sees it
    import numpy  # noqa: F401 - loads OpenBLAS with the worker's environment
    from threadpoolctl import threadpool_info
    pools = {}
    for info in threadpool_info():
        pools[info["user_api"]] = max(pools.get(info["user_api"], 0), info["num_threads"])
    return {"pid": os.getpid(), "omp": os.environ.get("OMP_NUM_THREADS"), "pools": pools}

for row in Parallel(n_jobs=2)(delayed(probe)(i) for i in range(4)):
    print(json.dumps(row), flush=True)
print(json.dumps({"main": os.getpid(), "omp": os.environ.get("OMP_NUM_THREADS")}))
"""


def _grid(tmp_path: Path, mode: str, env: dict[str, str]) -> tuple[list[dict], dict]:
    import json
    import subprocess
    import sys

    script = tmp_path / "grid.py"
    script.write_text(GRID_PROBE)
    r = subprocess.run([sys.executable, str(script), mode, str(HOOK_DIR)], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env})
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    main = rows.pop()
    return [w for w in rows if w["pid"] != main["main"]], main


def test_plain_loky_parallelism_gives_each_worker_its_share(tmp_path):
    """For real, with joblib, numpy and threadpoolctl: Parallel(n_jobs=2) with no thread argument
    (what GridSearchCV and cross_val_score run), under 4 exported threads. Without the hook joblib passes 4 into both workers;
    with it (loaded by its .pth file) each worker runs 2, and the main process keeps 4."""
    exported = {name: "4" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    marker = {"PROVISIONER_THREADS": "4", "LOKY_MAX_CPU_COUNT": "4"}
    workers, _ = _grid(tmp_path, "plain", {**exported, **marker})
    assert workers and {w["omp"] for w in workers} == {"4"}, "joblib's own behaviour changed: re-read _prepare_worker_env"
    workers, main = _grid(tmp_path, "hook", {**exported, **marker})
    assert workers, "no task ran in a loky worker"
    assert {w["omp"] for w in workers} == {"2"} and main["omp"] == "4"
    assert all(w["pools"].get("openmp", 0) <= 2 and w["pools"].get("blas", 0) <= 2 for w in workers), workers
    # A value the user exported themselves is theirs: joblib passes it on as it always did.
    workers, _ = _grid(tmp_path, "hook", {**exported, **marker, "OMP_NUM_THREADS": "3"})
    assert {w["omp"] for w in workers} == {"3"}


# --------------------------------------------------------------------------
# Polars' pool and joblib's workers set by plan_polars_threads / plan_joblib_workers
# --------------------------------------------------------------------------

OWN_COUNTS = {"POLARS_MAX_THREADS": "thread_env_polars_threads", "LOKY_MAX_CPU_COUNT": "thread_env_joblib_workers"}


def test_own_counts_of_the_plan_are_exported_and_scaled_not_given_the_thread_count(tmp_path):
    plan = plan_of("epyc_4545p", polars_threads=4, joblib_workers=2)
    values = role_values(plan)
    assert (values["thread_env_polars_threads"], values["thread_env_joblib_workers"]) == (4, 2)
    exported = values["_thread_env_values"]
    assert (exported["POLARS_MAX_THREADS"], exported["LOKY_MAX_CPU_COUNT"]) == ("4", "2")
    assert exported["OMP_NUM_THREADS"] == exported["PROVISIONER_THREADS"] == "16"
    # threads.conf: they leave the thread variables for the scaled counts, so ml-env scales them.
    conf = ml_env.read_config(_write(tmp_path, threads_conf(values)))
    assert "POLARS_MAX_THREADS" not in conf["variables"].split() and "LOKY_MAX_CPU_COUNT" not in conf["variables"].split()
    assert conf["variables"].split() == [v for v in values["thread_env_variables"] if v not in OWN_COUNTS]
    scaled = ml_env.parse_assignments(conf["scaled"])
    assert (scaled["POLARS_MAX_THREADS"], scaled["LOKY_MAX_CPU_COUNT"]) == ("4", "2")
    one = ml_env.trial_env({}, 0, 1, 16, conf)
    assert {k: one[k] for k in exported} == exported  # one job: what every other way work starts gets
    four = ml_env.trial_env({}, 0, 4, 4, conf)
    assert (four["OMP_NUM_THREADS"], four["POLARS_MAX_THREADS"], four["LOKY_MAX_CPU_COUNT"]) == ("4", "1", "1")


def test_own_counts_equal_to_the_thread_count_write_what_they_always_wrote():
    """The rule's counts (the default) and an option that names the cores: threads.conf and the
    exported values are those of a plan without the options."""
    plain = role_values(plan_of("laptop_4c"))
    same = role_values(plan_of("laptop_4c", polars_threads=4, joblib_workers=4))
    assert threads_conf(same) == threads_conf(plain)
    assert list(same["_thread_env_values"].items()) == list(plain["_thread_env_values"].items())
    assert same["_thread_env_count_variables"] == plain["thread_env_variables"]


def test_another_thread_count_gives_polars_and_joblib_that_count():
    """thread_env_threads other than the plan's: as for the DataLoader, the plan's own counts are
    for the plan's cores, so both variables carry the role's count."""
    values = role_values(plan_of("epyc_4545p", polars_threads=4, joblib_workers=2), {"thread_env_threads": 8})
    assert (values["thread_env_polars_threads"], values["thread_env_joblib_workers"]) == (8, 8)
    assert values["_thread_env_values"]["POLARS_MAX_THREADS"] == values["_thread_env_values"]["LOKY_MAX_CPU_COUNT"] == "8"
    assert values["_thread_env_own_counts"] == {}
    explicit = role_values(plan_of("epyc_4545p"), {"thread_env_threads": 8, "thread_env_polars_threads": 3})
    assert explicit["_thread_env_values"]["POLARS_MAX_THREADS"] == "3"
    assert explicit["_thread_env_scaled"]["POLARS_MAX_THREADS"] == "3"


def test_an_own_count_not_among_the_variables_is_not_exported():
    values = role_values(plan_of("epyc_4545p", polars_threads=4), {"thread_env_variables": ["OMP_NUM_THREADS"]})
    assert "POLARS_MAX_THREADS" not in values["_thread_env_values"]
    assert values["_thread_env_count_variables"] == ["OMP_NUM_THREADS"]


@pytest.mark.parametrize(("machine", "trials"), splits())
def test_each_joblib_worker_gets_its_share_of_own_counts_as_an_ml_env_trial(tmp_path, machine, trials):
    cores = load(machine)["cpu"]["cores"]
    plan = plan_of(machine, polars_threads=max(1, cores // 2), joblib_workers=1)
    values = role_values(plan)
    conf = _write(tmp_path, threads_conf(values))
    settings = hook.read_settings(str(conf))
    environ = dict(values["_thread_env_values"])
    worker = hook.worker_env({}, environ, trials, settings, ())
    trial, _cpus = ml_env.plan_trials(trials, cores, False, [[c] for c in range(cores)], ml_env.read_config(conf), {})[0]
    for name in [*values["thread_env_variables"], *values["_thread_env_scaled"], "PROVISIONER_THREADS"]:
        assert worker[name] == trial[name], name
    per_trial = cores // trials
    assert trial["POLARS_MAX_THREADS"] == str(max(1, max(1, cores // 2) * per_trial // cores))
    assert trial["LOKY_MAX_CPU_COUNT"] == "1"


def _preflight_problems(values: dict) -> list[str]:
    """The messages of role thread_env's preflight checks that fail for VALUES (the checks that
    need no gathered facts: every one but the OS's)."""
    from jinja2.nativetypes import NativeEnvironment

    task = yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())[0]
    env = NativeEnvironment(undefined=jinja2.StrictUndefined)
    env.filters.update(_ansible_filters())
    out = []
    for check in task["vars"]["__thread_env_checks"][1:]:
        if "match" in check["ok"] or "search" in check["ok"]:
            continue  # Ansible's own tests: not what these cases are about
        if not env.from_string(check["ok"]).render(values):
            out.append(str(env.from_string(check["msg"]).render(values)))
    return out


def test_preflight_refuses_own_counts_above_the_threads_unless_oversubscription_is_allowed():
    plan = plan_of("laptop_4c")
    assert _preflight_problems(role_values(plan)) == []
    over = role_values(plan, {"thread_env_polars_threads": 6})
    (problem,) = _preflight_problems(over)
    assert problem.startswith("thread_env_polars_threads=6 or thread_env_joblib_workers=4 is more than the 4 cores")
    assert "set thread_env_allow_oversubscription: true" in problem
    allowed_here = role_values(plan, {"thread_env_joblib_workers": 5, "thread_env_allow_oversubscription": True})
    assert _preflight_problems(allowed_here) == []
    (zero,) = _preflight_problems(role_values(plan, {"thread_env_joblib_workers": 0}))
    assert "thread_env_joblib_workers (0) must be 1 or more" in " ".join(zero.split())
    # The plan's own oversubscription reaches the role allowed (thread_env_allow_oversubscription
    # follows plan_allow_oversubscription).
    allowed = plan_of("laptop_4c", polars_threads=6, allow_oversubscription=True)
    assert _preflight_problems(role_values(allowed, play={"plan_allow_oversubscription": True})) == []
    assert _preflight_problems(role_values(allowed)) != []
