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


def role_values(plan: dict, overrides: dict | None = None) -> dict:
    """The role's defaults and vars rendered against PLAN, as a play would see them."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    variables = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    merged = {**defaults, **(overrides or {}), **variables}
    return _render(merged, {"provisioner_plan": plan, "ansible_facts": {"processor_count": 1}})


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
