"""The hpo workload's study on the Ray cluster (provisioner smoke --cluster): every trial ran, on
every node, with its reservation's threads; trials/min against the head alone.

Measured on the target (WORKERS, in the ML environment); judged on the control node, which
reads results.cluster: runs {cluster, head: {trials_per_min, trials,
trials_expected, errors, threads_seen, per_node}}, trial_cpus, nodes, members, trials, library,
rows, trees, sampler, ray, optuna.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from ..base import FAIL, PASS, Check, _problem, number
from ..target.ml import _missing
from .hpo import SIZES as HPO_SIZES
from .hpo import _hpo_queue, _trial, _trial_data

NAME = "cluster"
# The plan values whose change moves its figures: what the tuner may search (registry: KNOBS).
KNOBS: tuple[str, ...] = ("ray_trial_cpus", "ray_num_cpus")


# ---------------------------------------------------------------- target, ML environment

# Run only when named (--only cluster): the distributed trials on a Ray cluster, driven from its
# head. Its sizes are the hpo workload's.
ONLY_WHEN_NAMED = True
SIZES: dict[str, dict[str, Any]] = {"quick": {}, "full": {}}


def _suggest(trial) -> dict[str, Any]:
    """The hpo workload's search space (its enqueued parameter sets come out first)."""
    return {
        "num_leaves": trial.suggest_int("num_leaves", 15, 255),
        "max_depth": trial.suggest_int("max_depth", 4, 10),
        "learning_rate": trial.suggest_float("learning_rate", 0.02, 0.3, log=True),
    }


def _cluster_where() -> dict[str, Any]:
    """Inside a Ray task: its node, process and the OMP_NUM_THREADS Ray gave it."""
    import ray

    return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "omp": os.environ.get("OMP_NUM_THREADS")}


def _cluster_warm(rows: int, lib: str) -> dict[str, Any]:
    """Inside a Ray task: import the library and make the data, as a long-lived trial worker has."""
    __import__("sklearn.ensemble" if lib == "sklearn" else lib)
    _trial_data(rows)
    time.sleep(0.5)  # hold this worker so every CPU of the run gets a warm-up of its own
    return _cluster_where()


def _cluster_trial(params: dict[str, Any], rows: int, trees: int, lib: str) -> dict[str, Any]:
    """Inside a Ray task: one trial with the library's default threads (what the task's reservation
    gives it), and the OpenMP and BLAS threads its libraries run, as threadpoolctl reads them."""
    from threadpoolctl import threadpool_info

    where = _cluster_where()
    t0 = time.perf_counter()
    loss = _trial((params, None, rows, trees, lib))
    pools = threadpool_info()
    where.update(
        loss=loss,
        seconds=time.perf_counter() - t0,
        threads=max((pool["num_threads"] for pool in pools if pool.get("user_api") == "openmp"), default=None),
        blas_threads=max((pool["num_threads"] for pool in pools if pool.get("user_api") == "blas"), default=None),
    )
    return where


def w_cluster(p: dict[str, Any]) -> dict[str, Any]:
    """The hpo workload's study on a Ray cluster (role ray), driven from its head: every trial a Ray
    task reserving the plan's CPUs per trial, spread over every node, then the same trials on the
    head alone. An in-memory Optuna study asks and tells on the driver (one writer, no journal)."""
    import importlib.util

    missing = _missing("ray", "distributed") or _missing("optuna", "hpo")
    if missing:
        return missing
    import optuna
    import ray
    import ray.cloudpickle
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    with open(p["ray_config"], encoding="utf-8") as f:
        cfg = json.load(f)
    s = HPO_SIZES[p["profile"]]  # the hpo workload's trials, spread over the cluster
    lib = next((m for m in ("lightgbm", "xgboost") if importlib.util.find_spec(m)), "sklearn")
    per_trial = int(cfg.get("trial_cpus") or 1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # The other nodes have no copy of this archive: the trials go to them by value, as functions of
    # a __main__ script did, not by a reference to a module they cannot import.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__.split(".")[0]])
    ray.init(address=cfg["address"], _node_ip_address=cfg["node_address"], logging_level="WARNING", log_to_driver=False)
    try:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        names = {n["NodeID"]: n.get("NodeName") or n["NodeManagerAddress"] for n in alive}
        head = next((n["NodeID"] for n in alive if n["NodeManagerAddress"] == cfg["node_address"]), None)
        if head is None:
            return {"error": f"cluster: the head {cfg['node_address']} is not among the cluster's nodes"}
        slots = {n["NodeID"]: int(n["Resources"].get("CPU", 0)) // per_trial for n in alive}
        count = sum(slots.values()) * s["hpo_trials_per_worker"]
        queue = _hpo_queue(count)
        trial = ray.remote(num_cpus=per_trial)(_cluster_trial)
        warm = ray.remote(num_cpus=per_trial)(_cluster_warm)

        def study_run(strategy: Any, warm_tasks: int) -> dict[str, Any]:
            study = optuna.create_study(direction="minimize")
            for params in queue:
                study.enqueue_trial(params)
            # Every CPU slot's worker started and warmed before the clock runs.
            ray.get([warm.options(scheduling_strategy=strategy).remote(s["hpo_rows"], lib) for _ in range(warm_tasks)])
            t0 = time.perf_counter()
            asked = [study.ask() for _ in range(count)]
            refs = [
                trial.options(scheduling_strategy=strategy).remote(_suggest(t), s["hpo_rows"], s["hpo_trees"], lib) for t in asked
            ]
            done, errors = [], []
            for t, ref in zip(asked, refs, strict=True):
                try:
                    r = ray.get(ref)
                except Exception as exc:  # a lost trial is the finding
                    study.tell(t, state=optuna.trial.TrialState.FAIL)
                    errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                    continue
                study.tell(t, r["loss"])
                done.append(r)
            secs = time.perf_counter() - t0
            per_node: dict[str, int] = {}
            for r in done:
                per_node[names.get(r["node"], r["node"])] = per_node.get(names.get(r["node"], r["node"]), 0) + 1
            return {
                "trials": len(done),
                "trials_expected": count,
                "seconds": secs,
                "trials_per_min": len(done) / secs * 60 if secs > 0 else None,
                "per_node": per_node,
                "processes_seen": len({(r["node"], r["pid"]) for r in done}),
                "threads_seen": sorted({r["threads"] for r in done if r["threads"] is not None}),
                "blas_threads_seen": sorted({r["blas_threads"] for r in done if r["blas_threads"] is not None}),
                "omp_seen": sorted({r["omp"] or "unset" for r in done}),
                "best_loss": min((r["loss"] for r in done), default=None),
                "errors": errors[:5],
            }

        runs = {
            "cluster": study_run("SPREAD", sum(slots.values())),
            "head": study_run(NodeAffinitySchedulingStrategy(node_id=head, soft=False), slots[head]),
        }
        nodes = [
            {
                "name": names[n["NodeID"]],
                "address": n["NodeManagerAddress"],
                "head": n["NodeID"] == head,
                "cpus": n["Resources"].get("CPU"),
                "memory_bytes": n["Resources"].get("memory"),
                "object_store_bytes": n["Resources"].get("object_store_memory"),
            }
            for n in alive
        ]
    finally:
        ray.shutdown()
    return {
        "library": lib,
        "ray": ray.__version__,
        "optuna": optuna.__version__,
        "trial_cpus": per_trial,
        "members": cfg.get("members", []),
        "member_addresses": cfg.get("member_addresses", []),
        "nodes": nodes,
        "trials": count,
        "rows": s["hpo_rows"],
        "trees": s["hpo_trees"],
        "runs": runs,
        "sampler": "the hpo workload's enqueued parameter sets, asked and told by one in-memory Optuna study on the head",
    }


WORKERS = {"cluster": w_cluster}


# ---------------------------------------------------------------- target, root parent (stdlib)


def drive(runner: Any) -> dict[str, Any]:
    """The distributed trials, driven from the Ray head: its node's configuration says where the cluster is."""
    return runner.worker("cluster", ray_config=runner.args.ray_config)


# ---------------------------------------------------------------- control node


def cluster_checks(cl: dict[str, Any]) -> list[Check]:
    """The hpo workload's study on the Ray cluster (provisioner smoke --cluster): trials/min on
    every node against the same trials on the head alone. A correctness figure: every trial ran,
    every node ran some, each with the threads its reservation gives; lab servers that share one
    machine's cores are not expected to be faster together (docs/ray.md)."""
    problem = _problem("cluster.trials", "distributed trials", "trials on the Ray cluster", cl)
    if problem:
        return [problem]
    runs = cl["runs"]
    cluster, head = runs["cluster"], runs["head"]
    per_trial = cl["trial_cpus"]
    nodes = [n["name"] for n in cl["nodes"]]
    detail = (
        f"{cl['trials']} {cl['library']} trials ({cl['rows']:,} rows, {cl['trees']} trees) per run, {per_trial} CPU each, "
        f"{cl['sampler']}; Ray {cl['ray']}, Optuna {cl['optuna']}; nodes: "
        + ", ".join(f"{n['name']} ({number(n['cpus'])} CPUs)" for n in cl["nodes"])
    )
    problems = [
        f"{name}: {r['trials']} of {r['trials_expected']} trials completed" + (f" ({r['errors'][0]})" if r.get("errors") else "")
        for name, r in (("cluster", cluster), ("head alone", head))
        if r["trials"] != r["trials_expected"]
    ]
    missing = sorted(set(cl.get("members") or nodes) - set(nodes))
    if missing:
        problems.append(f"member(s) {', '.join(missing)} not in the cluster")
    idle = sorted(n for n in nodes if not cluster["per_node"].get(n))
    if idle:
        problems.append(f"node(s) {', '.join(idle)} ran no trial")
    wrong = [t for t in cluster["threads_seen"] + head["threads_seen"] if t != per_trial]
    if wrong:
        problems.append(f"trials ran {sorted(set(wrong))} OpenMP threads, not the {per_trial} their reservation gives")
    ratio = cluster["trials_per_min"] / head["trials_per_min"] if cluster["trials_per_min"] and head["trials_per_min"] else None
    spread = ", ".join(f"{n} {c}" for n, c in sorted(cluster["per_node"].items()))
    if problems:
        status, reason = FAIL, "the distributed study lost work: " + "; ".join(problems)
    else:
        status = PASS
        reason = f"every trial ran, on every node ({spread}), {per_trial} thread(s) each" + (
            f"; {ratio:.2f}x the head alone" if ratio else ""
        )
    return [
        Check(
            "cluster.trials",
            "distributed trials",
            "trials on the Ray cluster",
            status,
            reason,
            cluster["trials_per_min"],
            "trials/min",
            head["trials_per_min"],
            "the same trials on the head alone (a correctness figure where the nodes share cores)",
            ratio,
            detail=detail,
        )
    ]


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return cluster_checks(result)
