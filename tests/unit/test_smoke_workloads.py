"""The smoke test's workloads of real jobs: scikit-learn, feature engineering, the in-RAM feature
matrix, the Optuna study, PyTorch data loading and TensorFlow, judged against their limits."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
import smoke_script

from provisioner import report, smoke
from provisioner.smoke import zipapp
from provisioner.smoke.target.ml import _planned

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]

# What the workers printed on a 2-core AMD EPYC VM (tuned mode, plan: 2 threads, 2 trials).
SKLEARN = {
    "sklearn": "1.9.1", "rows": 20000, "trees": 40,
    "forest": {"all": {"n_jobs": 2, "times_s": [0.52, 0.55], "row_trees_per_s": 1.5e6},
               "one": {"n_jobs": 1, "times_s": [0.95, 0.97], "row_trees_per_s": 0.83e6}},
    "grid": {"estimator": "MLPClassifier(max_iter=8)", "grid": {}, "candidates": 4, "folds": 3, "rows": 20000,
             "n_jobs": 2, "n_jobs_how": "the plan's joblib_workers", "share": 1, "cores": 2,
             "parallel_s": 2.0, "sequential_s": 3.4, "parallel_per_min": 120.0, "sequential_per_min": 70.6,
             "workers_seen": [{"pid": 11, "main": False, "blas": [1], "openmp": [1]},
                              {"pid": 12, "main": False, "blas": [1], "openmp": [1]}]},
}
FEATURES = {
    "rows": 1000000, "repeats": 3, "pipeline": "filter, group-by aggregate, join, window",
    "polars": {"version": "2.1.0", "threads": 2, "threads_how": "the plan's polars_threads", "times_s": [0.30, 0.31, 0.33],
               "rows_per_s": 3.2e6, "result_rows": 691000, "checksum": 1.0},
    "pandas": {"version": "3.1.1", "threads": 1, "times_s": [1.2, 1.3, 1.25], "rows_per_s": 0.8e6, "result_rows": 691000,
               "checksum": 1.0},
    "polars_one": {"version": "2.1.0", "threads": 1, "times_s": [0.5], "rows_per_s": 2.0e6, "result_rows": 691000},
}
MATRIX = {
    "rows": 200000, "features": 200, "bytes": 160_800_000, "rows_how": "the quick profile's 200,000 rows",
    "planned_rows": 24_000_000, "planned_bytes": 19_200_000_000, "folds": 4, "threads": 2, "build_s": 0.4,
    "build_gbps": 0.4, "cv_s": 0.2, "cv_gflops": 80.0, "sgemm_gflops": 150.0, "r2": 0.8, "mem_available_before": 2e10,
    "max_rss_bytes": 3e8, "swapped_out_pages": 0, "how": "ridge regression over contiguous fold views",
}
LOADER = {
    "torch": "2.13.0+cpu", "rows": 200000, "shards": 8, "shard_bytes": 52e6, "batch": 512, "epochs": 1, "features": 64,
    "network": "MLP 64-512-512-1, SGD", "workers": 1, "workers_how": "the plan's dataloader_workers", "threads": 1,
    "threads_how": "the plan's dataloader_threads", "where": "/data/provisioner-smoke-x/shards",
    "planned": {"samples": 199000, "seconds": 4.0, "samples_per_s": 49750.0, "wait_share": 0.05},
    "in_memory": {"samples": 199000, "seconds": 3.6, "samples_per_s": 55277.0, "wait_share": 0.0},
    "workers0": {"samples": 199000, "seconds": 5.5, "samples_per_s": 36181.0, "wait_share": 0.35, "threads": 2},
}
TENSORFLOW = {
    "tensorflow": "2.20.0", "onednn": True, "onednn_how": "TensorFlow's IsMklEnabled() (oneDNN operations on)",
    "intra_op_threads": 2, "inter_op_threads": 1, "threads_how": "the plan's tf_intra_op_threads", "batch": 1024,
    "width": 512, "step_s": [0.01, 0.011, 0.012], "samples_per_s": 93000.0, "gflops": 60.0, "sgemm_gflops": 120.0,
    "sgemm_n": 2048,
}


@pytest.fixture
def tuned():
    raw = json.loads((DATA / "smoke_raw_baseline.json").read_text())
    raw["mode"] = "tuned"
    raw["plan"] = {"threads_per_job": 2, "trials": 2, "threads_per_trial": 1, "polars_threads": 2, "joblib_workers": 2}
    raw["config"] = {}
    raw["results"] = {"sklearn": copy.deepcopy(SKLEARN), "features": copy.deepcopy(FEATURES),
                      "matrix": copy.deepcopy(MATRIX), "dataloader": copy.deepcopy(LOADER),
                      "tensorflow": copy.deepcopy(TENSORFLOW)}
    return raw


@pytest.fixture
def script():
    return smoke_script.load()


def by_id(rep: smoke.HostReport) -> dict[str, smoke.Check]:
    return {c.id: c for c in rep.checks}


def test_every_workload_is_held_against_its_limit(tuned):
    rep = smoke.evaluate(tuned)
    checks = by_id(rep)
    for cid, limit in (("sklearn.forest", 0.83 * 2), ("sklearn.grid", 70.6 * 2), ("features.polars", 2.0 * 2),
                       ("matrix.cv", 150.0), ("dataloader.samples", 55277.0), ("tensorflow.step", 120.0)):
        assert checks[cid].limit == pytest.approx(limit), cid
        check = checks[cid]
        assert check.figure is not None and check.limit is not None, cid
        assert check.ratio == pytest.approx(check.figure / check.limit), cid
        assert checks[cid].status == smoke.PASS, (cid, checks[cid].reason)
    assert checks["sklearn.threads"].status == smoke.PASS and "within the share of 1" in checks["sklearn.threads"].reason
    assert checks["matrix.memory"].status == smoke.PASS and checks["matrix.memory"].limit == pytest.approx(19.2)
    assert checks["dataloader.wait"].status == smoke.PASS and checks["dataloader.wait"].figure == pytest.approx(5.0)
    assert "1.38x num_workers=0" in checks["dataloader.samples"].reason
    assert checks["features.pandas"].status == smoke.INFO and "4.0x pandas" in checks["features.pandas"].reason
    mine = [c for c in rep.checks if c.group not in ("host", "configuration")]
    assert {c.status for c in mine} <= {smoke.PASS, smoke.INFO}
    assert checks["features.polars"].spread == [pytest.approx(1e6 / 0.33 / 1e6), pytest.approx(1e6 / 0.30 / 1e6)]


def test_a_loky_worker_with_more_blas_threads_than_its_share_fails(tuned):
    """n_jobs=2 on 2 cores with every worker on 2 BLAS threads: 4 threads on 2 cores is reported as such."""
    for w in tuned["results"]["sklearn"]["grid"]["workers_seen"]:
        w["blas"] = [2]
    rep = smoke.evaluate(tuned)
    c = by_id(rep)["sklearn.threads"]
    assert c.status == smoke.FAIL and rep.status == smoke.FAIL
    assert c.reason.startswith("oversubscribed: 2 of 2 worker(s) run up to 2 BLAS/OpenMP threads, their share is 1")
    assert c.figure == 2.0 and c.limit == 1.0 and c.ratio == 2.0 and not c.higher_is_better


def test_an_openmp_pool_over_the_share_fails_too_and_the_main_process_is_not_a_worker(tuned):
    seen = tuned["results"]["sklearn"]["grid"]["workers_seen"]
    seen[0]["openmp"] = [2]
    seen.append({"pid": 10, "main": True, "blas": [2], "openmp": [2]})  # the sequential search's own process
    c = by_id(smoke.evaluate(tuned))["sklearn.threads"]
    assert c.status == smoke.FAIL and c.reason.startswith("oversubscribed: 1 of 2 worker(s)")
    tuned["results"]["sklearn"]["grid"]["workers_seen"] = [seen[2]]
    assert by_id(smoke.evaluate(tuned))["sklearn.threads"].status == smoke.SKIP


def test_the_library_defaults_only_report_the_workers_threads(tuned):
    tuned["mode"] = "baseline"
    grid = tuned["results"]["sklearn"]["grid"]
    grid.update(share=None, n_jobs="library default (None: one)", parallel_per_min=70.0, workers_seen=[])
    checks = by_id(smoke.evaluate(tuned))
    assert checks["sklearn.threads"].status == smoke.INFO
    assert checks["sklearn.grid"].limit == pytest.approx(70.6) and checks["sklearn.grid"].status == smoke.PASS


def test_a_slow_parallel_search_or_forest_is_graded_down(tuned):
    sk = tuned["results"]["sklearn"]
    sk["grid"]["parallel_per_min"] = 70.6 * 2 * 0.3
    sk["forest"]["all"]["row_trees_per_s"] = 0.83e6 * 2 * 0.2
    checks = by_id(smoke.evaluate(tuned))
    assert checks["sklearn.grid"].status == smoke.WARN and "cores / n_jobs" in checks["sklearn.grid"].reason
    assert checks["sklearn.forest"].status == smoke.FAIL


def test_polars_on_fewer_threads_than_planned_fails_and_differing_pipelines_fail(tuned):
    fe = tuned["results"]["features"]
    fe["polars"]["threads"] = 1
    fe["pandas"]["result_rows"] = 5
    checks = by_id(smoke.evaluate(tuned))
    assert checks["features.polars"].status == smoke.FAIL
    assert checks["features.polars"].reason.startswith("Polars runs 1 threads, the plan says 2 (POLARS_MAX_THREADS)")
    assert checks["features.pandas"].status == smoke.FAIL and "the pipelines differ" in checks["features.pandas"].reason


def test_a_matrix_that_swaps_or_a_cv_that_did_not_fit_fails(tuned):
    mx = tuned["results"]["matrix"]
    mx["swapped_out_pages"] = 1200
    assert by_id(smoke.evaluate(tuned))["matrix.memory"].status == smoke.FAIL
    mx.update(swapped_out_pages=0, r2=0.01)
    c = by_id(smoke.evaluate(tuned))["matrix.memory"]
    assert c.status == smoke.FAIL and "R²" in c.reason
    mx.update(r2=0.8, cv_gflops=15.0)
    assert by_id(smoke.evaluate(tuned))["matrix.cv"].status == smoke.FAIL


def test_a_loop_waiting_for_data_warns_then_fails(tuned):
    dl = tuned["results"]["dataloader"]
    for share, status in ((0.3, smoke.WARN), (0.7, smoke.FAIL)):
        dl["planned"]["wait_share"] = share
        assert by_id(smoke.evaluate(tuned))["dataloader.wait"].status == status
    dl["planned"]["samples_per_s"] = 55277.0 * 0.2
    assert by_id(smoke.evaluate(tuned))["dataloader.samples"].status == smoke.FAIL


def test_tensorflow_without_onednn_fails_when_tuned(tuned):
    tuned["results"]["tensorflow"]["onednn"] = False
    c = by_id(smoke.evaluate(tuned))["tensorflow.step"]
    assert c.status == smoke.FAIL and "oneDNN is off" in c.reason
    tuned["mode"] = "baseline"
    assert by_id(smoke.evaluate(tuned))["tensorflow.step"].status == smoke.WARN


@pytest.mark.parametrize(
    ("task", "module", "component"),
    [("tensorflow", "tensorflow", "tensorflow"), ("sklearn", "sklearn", "core"), ("features", "polars", "core"),
     ("dataloader", "torch", "torch"), ("hpo", "optuna", "hpo")],
)
def test_a_missing_library_is_a_skip_naming_its_component(script, monkeypatch, task, module, component):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    result = script.WORKERS[task]({"profile": "quick", "mode": "tuned", "threads": 2, "trials": 2, "workdir": "/nonexistent"})
    assert result == {"skipped": f"{module} is not installed in this environment (component {component})"}
    checks = [c for c in smoke.evaluate({"mode": "tuned", "results": {task: result}}).checks if c.group != "configuration"]
    assert [c.status for c in checks] == [smoke.SKIP] and f"component {component}" in checks[0].reason


def test_every_workload_is_a_choice_of_the_role_and_runs_in_its_own_worker(script):
    import yaml

    spec = yaml.safe_load((ROOT / "roles/smoke/meta/argument_specs.yml").read_text())
    # The default run's workloads, then those run only when named (the cluster's comes with smoke_cluster).
    named = [t for t in script.CLUSTER_TASKS if t != "cluster"]
    assert spec["argument_specs"]["main"]["options"]["smoke_workloads"]["choices"] == list(script.TASKS) + named
    for task in ("sklearn", "features", "matrix", "dataloader", "tensorflow", "hpo"):
        assert task in script.TASKS and task in script.WORKERS
    assert set(script.PROFILES["quick"]) == set(script.PROFILES["full"])


def test_the_plan_values_reach_the_workers_and_their_absence_is_said():
    assert _planned({"plan": {"dataloader_workers": 0}}, "dataloader_workers", 3, "x") == (
        0, "the plan's dataloader_workers")
    assert _planned({"plan": {}}, "joblib_workers", 4, "the physical cores") == (
        4, "the physical cores (the plan has no joblib_workers)")


def test_the_new_workloads_render_in_the_report_like_the_others(tuned):
    page = report.render_html([smoke.evaluate(tuned)])
    for group in ("scikit-learn", "feature engineering", "feature matrix", "data loading", "tensorflow"):
        assert f"<h3>{group}</h3>" in page
    for cid in ("sklearn.threads", "features.polars", "matrix.cv", "dataloader.wait", "tensorflow.step"):
        assert f'check="{cid}"' in page


# ---------------------------------------------------------------- what a user's code gets


def test_no_workload_sets_a_thread_limit_a_users_code_would_not():
    """Tuned figures measure plain code in the ML user's login shell: the environment decides every
    pool. Only the one-core reference runs limit threads (to 1), through _limits or a 1 argument."""
    source = "\n".join(data.decode() for name, data in zipapp.sources().items() if name.endswith(".py"))
    for limit in ("inner_max_num_threads=", "parallel_config(", "set_num_threads(p[", "set_num_threads(cores",
                  "set_cpu_count(", 'nthread"] = p[', "set_intra_op_parallelism_threads", "set_inter_op_parallelism_threads",
                  "_limits(p[", "_limits(cores", "n_jobs=cores"):
        assert limit not in source, limit


# The workers of a zipapp like the one the role ships: the archive's own entries, this __main__
# (which adds the tasks below to the parent's) and the tasks as a module of the archive.
CRASHING_MAIN = """
import os, sys
import provisioner.smoke
from provisioner.smoke.target import parent as smoke
import crashing

# Not a copy the editable install or the source tree put on sys.path first.
assert provisioner.smoke.__file__.startswith(os.path.abspath(sys.argv[0]) + "/"), provisioner.smoke.__file__
smoke.WORKERS.update(after=crashing.after_its_result, before=crashing.before_its_result, pool=crashing.with_a_process_pool,
                     children=crashing.children_import_the_archive)
raise SystemExit(smoke.main(sys.argv[1:]))
"""
CRASHING_LIBRARY = """
import ctypes, os, sys


def after_its_result(p):
    # A native library whose exit handler aborts, as pyarrow's thread pools can in teardown.
    import atexit
    atexit.register(os.abort)
    return {"measured": 1.5}


def before_its_result(p):
    sys.stderr.write("terminate called without an active exception\\n")
    sys.stderr.flush()
    ctypes.string_at(0)  # a native crash inside the measurement


def with_a_process_pool(p):
    # What GridSearchCV(n_jobs=2) leaves behind: loky's reusable workers, idle, holding stdout.
    from joblib import Parallel, delayed

    return {"pids": sorted(set(Parallel(n_jobs=2)(delayed(os.getpid)() for _ in range(8))))}


def where(_):
    import provisioner.smoke
    return provisioner.smoke.__file__


def children_import_the_archive(p):
    # hpo's spawn pool and joblib's loky workers: a zip's __main__ is not re-run in a child, so
    # what they are handed is imported by name, from the archive on the sys.path they inherit.
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from joblib import Parallel, delayed
    from provisioner.smoke.target.ml import median

    with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as pool:
        spawn = list(pool.map(where, range(2))) + list(pool.map(median, [[1.0, 3.0]]))
    loky = Parallel(n_jobs=2)(delayed(where)(i) for i in range(2)) + Parallel(n_jobs=2)(delayed(median)([1.0, 5.0]) for _ in range(1))
    return {"spawn": spawn, "loky": loky}
"""


@pytest.fixture
def crashing_runner(script, tmp_path):
    """The real runner, starting real worker processes of a zipapp of the real workload code with
    the tasks above."""
    import argparse
    import sys
    import zipfile

    entries = {**zipapp.sources(), "__main__.py": CRASHING_MAIN.encode(), "crashing.py": CRASHING_LIBRARY.encode()}
    archive = tmp_path / "crashing.pyz"
    with zipfile.ZipFile(archive, "w") as zf:
        for name, data in sorted(entries.items()):
            zf.writestr(name, data)
    args = argparse.Namespace(python=sys.executable, profile="quick", mode="baseline", user=None)
    return script.Runner(args, str(archive), str(tmp_path), threads=2, trials=2)


def test_a_worker_keeps_a_result_it_printed_and_a_crash_says_where_it_happened(crashing_runner):
    """For real, through the runner: a worker whose library aborts in the interpreter's teardown
    still hands over what it measured, with the exit beside it; one that crashes while measuring
    is an error naming the library's own message and the Python line, not the shell's bare exit
    status."""
    runner = crashing_runner
    after = runner.worker("after")
    assert after["measured"] == 1.5 and after["exit_after_result"].startswith("exited -6: "), after
    failed = runner.worker("before")["error"]
    assert failed.startswith("before: exited -11: terminate called without an active exception; "
                             "Fatal Python error: Segmentation fault; File "), failed
    assert failed.endswith('crashing.pyz/crashing.py", line 15 in before_its_result'), failed
    assert "in string_at" in failed  # where it crashed, in the library


def test_a_worker_that_used_a_process_pool_returns_with_the_pool_gone(script, crashing_runner, monkeypatch):
    """loky's idle workers inherit the worker's stdout; the worker's normal exit stops them. A
    worker that left without its interpreter's teardown had the runner wait out their idle
    timeout (300 s): the sklearn workload took 341 s instead of 8."""
    monkeypatch.setitem(script.PROFILES["quick"], "timeout", 60)  # well under loky's idle timeout
    result = crashing_runner.worker("pool")
    assert "error" not in result and "exit_after_result" not in result, result
    assert result["pids"] and all(not Path(f"/proc/{pid}").exists() for pid in result["pids"]), result


def test_a_workers_children_import_the_workload_code_from_its_archive(crashing_runner, tmp_path):
    """For real: the spawn pool (hpo's) and joblib's loky workers a worker starts import what they
    are handed from the zipapp the worker runs, by name: no __main__ script to re-run any more."""
    result = crashing_runner.worker("children")
    assert "error" not in result, result
    inside = str(tmp_path / "crashing.pyz") + "/provisioner/smoke/__init__.py"
    assert result["spawn"] == [inside, inside, 2.0] and result["loky"] == [inside, inside, 3.0], result
