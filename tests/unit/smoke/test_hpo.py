"""The Optuna study's target code: the environment each parallel study process starts with."""

from __future__ import annotations

from provisioner.smoke.workloads import hpo


def test_the_study_processes_get_what_ml_env_gives_a_trial(monkeypatch):
    """The parallel study's processes start with the environment `ml-env --trials N --print` shows."""
    import subprocess

    printed = "# cores=4 (thread settings) trials=2 threads_per_trial=2\n# trial 0\nML_ENV_TRIAL=0 OMP_NUM_THREADS=2 PROVISIONER_THREADS=2\n# trial 1\nML_ENV_TRIAL=1 OMP_NUM_THREADS=2 PROVISIONER_THREADS=2\n"
    calls = []

    def run(argv, **kw):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, printed, "")

    monkeypatch.setattr(hpo.shutil, "which", lambda name: "/usr/local/bin/ml-env" if name == "ml-env" else None)
    env, how = hpo.ml_env_trial(2, run=run)
    assert calls == [["/usr/local/bin/ml-env", "--trials", "2", "--print"]]
    assert env == {"OMP_NUM_THREADS": "2", "PROVISIONER_THREADS": "2"} and how == "ml-env --trials 2"
    monkeypatch.setattr(hpo.shutil, "which", lambda name: None)
    assert hpo.ml_env_trial(2, run=run) == (None, "ml-env is not on PATH (role thread_env installs it)")
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    with hpo._environ({"OMP_NUM_THREADS": "2", "PROVISIONER_THREADS": "2"}):
        assert (hpo.os.environ["OMP_NUM_THREADS"], hpo.os.environ["PROVISIONER_THREADS"]) == ("2", "2")
    assert hpo.os.environ["OMP_NUM_THREADS"] == "4" and "PROVISIONER_THREADS" not in hpo.os.environ


def test_tune_measures_the_candidates_trials_over_the_same_enqueued_trials(monkeypatch, tmp_path):
    """provisioner tune's measurement: N processes as `ml-env --trials N` starts them (N from the
    candidate's variable), the same trials whatever N is, a study of its own each time."""
    monkeypatch.setitem(hpo.SIZES, "quick", {"hpo_rows": 2000, "hpo_trees": 5, "hpo_trials_per_worker": 2})
    asked = []

    def ml_env(n):
        asked.append(n)
        return {"OMP_NUM_THREADS": "1"}, f"ml-env --trials {n}"

    monkeypatch.setattr(hpo, "ml_env_trial", ml_env)
    p = {"profile": "quick", "mode": "tuned", "threads": 2, "trials": 1, "workdir": str(tmp_path), "tune": True}
    out = {}
    for n in ("1", "2", "2"):  # the same workdir again: each measurement starts its own study
        monkeypatch.setenv("PROVISIONER_TUNE_TRIALS", n)
        out[n] = hpo.w_hpo(p)
    one, two = out["1"]["tuned"], out["2"]["tuned"]
    assert asked == [2, 2]  # one process needs no trial environment
    assert (one["procs"], two["procs"]) == (1, 2) and one["trials"] == two["trials"] == 4
    assert two["processes_seen"] == 2 and two["threads_each"] == "1"
    assert hpo.TUNE.figure(out["1"]) == one["trials_per_min"] > 0
    monkeypatch.setattr(hpo, "ml_env_trial", lambda n: (None, "ml-env is not on PATH (role thread_env installs it)"))
    assert hpo.w_hpo(p) == {"error": "ml-env is not on PATH (role thread_env installs it)"}


def test_one_trial_at_a_time_says_why():
    """No parallel run: on one core there is nothing to share; on more, the plan asked for one trial (plan_trials: 1)."""
    from provisioner.smoke.base import SKIP

    run = {"trials_per_min": 30.0}
    hpo_raw = {"library": "lightgbm", "sampler": "s", "trials": 2, "rows": 10, "trees": 2, "runs": {"sequential": run}}
    for workers, cores, why in ((1, 1, "on this host (one core)"), (1, 4, "the plan's trials is 1, plan_trials")):
        (check,) = hpo.hpo_checks({"mode": "tuned"}, {**hpo_raw, "workers": workers, "cores": cores})
        assert check.status == SKIP and why in check.reason, check.reason
