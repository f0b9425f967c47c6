"""The hpo workload's study on the Ray cluster (provisioner smoke --cluster): every trial ran, on
every node, with its reservation's threads; trials/min against the head alone.

Runs on the control node. Reads results.cluster: runs {cluster, head: {trials_per_min, trials,
trials_expected, errors, threads_seen, per_node}}, trial_cpus, nodes, members, trials, library,
rows, trees, sampler, ray, optuna.
"""

from __future__ import annotations

from typing import Any

from ..base import FAIL, PASS, Check, _problem, number

NAME = "cluster"


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
