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
