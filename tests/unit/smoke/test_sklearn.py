"""The scikit-learn workload's target code: the scorer that reads each worker's thread pools, and the
whole workload for real from a zipapp under oversubscribing thread settings."""

from __future__ import annotations

import json

from provisioner import smoke
from provisioner.smoke import zipapp
from provisioner.smoke.workloads import sklearn


def test_the_scorer_reads_the_thread_pools_of_the_process_it_runs_in(tmp_path):
    import numpy as np
    from threadpoolctl import threadpool_limits

    class Always:
        def predict(self, x):
            return np.ones(len(x))

    scorer = sklearn._record_threads(str(tmp_path / "threads"))
    with threadpool_limits(limits=1):
        assert scorer(Always(), np.zeros((2, 1)), np.array([1.0, 0.0])) == 0.5
    (written,) = tmp_path.glob("threads-*.json")
    pools = json.loads(written.read_text())["pools"]
    assert [p["num_threads"] for p in pools if p["user_api"] == "blas"] and all(p["num_threads"] == 1 for p in pools)


PLAIN_SKLEARN = """
import json, sys
sys.path.insert(0, sys.argv[1])  # the zipapp: its workers' children import the workload code from it
import provisioner.smoke
from provisioner.smoke.workloads import sklearn
assert provisioner.smoke.__file__.startswith(sys.argv[1]), provisioner.smoke.__file__
sklearn.SIZES["quick"].update(sklearn_rows=2000, sklearn_trees=4, sklearn_grid_rows=1500, sklearn_grid_iter=2, sklearn_folds=2)
print(json.dumps(sklearn.w_sklearn({"profile": "quick", "mode": "tuned", "threads": 4, "workdir": sys.argv[3],
                                    "plan": {"joblib_workers": 2}})))
"""


def test_the_workers_threads_check_catches_a_plain_search_that_oversubscribes(tmp_path):
    """For real: the sklearn workload's plain GridSearchCV (n_jobs=2, no thread limit) under 4
    exported threads and no start-up hook: joblib passes the 4 into both workers, and the check
    that holds each worker to its share of 2 fails, naming the fix."""
    import os
    import subprocess
    import sys

    probe = tmp_path / "probe.py"
    probe.write_text(PLAIN_SKLEARN)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_NUM_THREADS": "4", "OPENBLAS_NUM_THREADS": "4",
           "MKL_NUM_THREADS": "4", "LOKY_MAX_CPU_COUNT": "4", "PROVISIONER_THREADS": "4"}
    pyz = zipapp.build(tmp_path)
    r = subprocess.run([sys.executable, str(probe), str(pyz), "-", str(tmp_path)], capture_output=True, text=True,
                       timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    sk = json.loads(r.stdout.strip().splitlines()[-1])
    assert sk["grid"]["share"] == 2 and sk["grid"]["n_jobs"] == 2
    (c,) = [c for c in smoke.evaluate({"mode": "tuned", "threads": 4, "results": {"sklearn": sk}}).checks if c.id == "sklearn.threads"]
    assert c.status == smoke.FAIL and c.reason.startswith("oversubscribed"), c.reason
    assert c.figure == 4.0 and "provisioner up --tags mlstack,thread_env" in c.reason
