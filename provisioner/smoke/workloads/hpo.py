"""Parallel hyperparameter-search trials against the same trials one after another, and the oversubscribed run.

Runs on the control node. Reads results.hpo: runs {sequential, parallel, oversubscribed:
{trials_per_min, procs, threads_each, trials, trials_expected, processes_seen}}, trials,
library, rows, trees, sampler, best_loss; the raw result's mode.
"""

from __future__ import annotations

from typing import Any

from ..base import FAIL, INFO, PASS, SKIP, WARN, Check, _problem, grade

NAME = "hpo"

HPO_GRADES = (0.9, 0.7)  # N processes of cores/N threads should at least match one-after-another


def hpo_checks(raw: dict[str, Any], hpo: dict[str, Any]) -> list[Check]:
    problem = _problem("hpo.parallel", "hyperparameter search", "parallel trials", hpo)
    if problem:
        return [problem]
    runs = hpo["runs"]
    detail = (
        f"{hpo['trials']} {hpo['library']} trials ({hpo['rows']:,} rows, {hpo['trees']} trees) per run, one run each, "
        f"{hpo['sampler']}" + (f"; best loss {hpo['best_loss']:.4f}" if isinstance(hpo.get("best_loss"), float) else "")
    )
    seq = runs["sequential"]["trials_per_min"]
    if "parallel" not in runs:
        return [
            Check(
                "hpo.parallel",
                "hyperparameter search",
                "parallel trials",
                SKIP,
                "one trial at a time on this host (one core): nothing to run in parallel",
                seq,
                "trials/min",
                detail=detail,
            )
        ]
    par, over = runs["parallel"], runs["oversubscribed"]
    ratio = par["trials_per_min"] / seq
    each = par["threads_each"]
    status = grade(ratio, HPO_GRADES)
    reason = f"{par['procs']} processes x {each} thread(s): {ratio:.2f}x the one-after-another rate"
    if status != PASS:
        reason += "; parallel trials lose to running them one by one: each trial's threads must be cores / trials"
    lost = [
        f"{name}: {r['trials']} of {r['trials_expected']} trials completed"
        for name, r in runs.items()
        if "trials_expected" in r and r["trials"] != r["trials_expected"]
    ]
    if "processes_seen" in par and par["processes_seen"] != par["procs"]:
        lost.append(f"the study's trials came from {par['processes_seen']} process(es), not {par['procs']}")
    if lost:
        status = FAIL
        reason = "the shared study lost work (" + "; ".join(lost) + "); " + reason
    out = [
        Check(
            "hpo.parallel",
            "hyperparameter search",
            "parallel trials",
            status,
            reason,
            par["trials_per_min"],
            "trials/min",
            seq,
            f"the same trials one after another, {runs['sequential']['threads_each']} thread(s) each",
            ratio,
            detail=detail,
        )
    ]
    oratio = over["trials_per_min"] / par["trials_per_min"]
    saved = 1 - oratio
    if raw.get("mode") != "tuned":
        ostatus, oreason = (
            INFO,
            (
                f"oversubscribed ({over['procs']} processes x {over['threads_each']} threads) runs at "
                f"{oratio:.0%} of the parallel rate with library defaults"
            ),
        )
    elif oratio <= 1.05:
        ostatus, oreason = (
            PASS,
            f"oversubscribed ({over['procs']} processes x {over['threads_each']} threads, {over.get('trials', hpo['trials'])} trials) runs at {oratio:.0%} of the planned rate: the thread plan saves {max(saved, 0):.0%}",
        )
    else:
        ostatus, oreason = WARN, f"oversubscribed ran {oratio - 1:.0%} faster than the plan's threads per trial here"
    out.append(
        Check(
            "hpo.oversubscribed",
            "hyperparameter search",
            "oversubscribed trials (every trial all threads)",
            ostatus,
            oreason,
            over["trials_per_min"],
            "trials/min",
            par["trials_per_min"],
            "the planned parallel rate",
            oratio,
            detail=detail,
        )
    )
    return out


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return hpo_checks(raw, result)
