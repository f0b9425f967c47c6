"""Gradient boosting (XGBoost, LightGBM, CatBoost hist training): the all-core rate against the one-core rate x the cores.

Runs on the control node. Reads results.gbdt: rows, cols, depth and per library
{all, one: {row_trees_per_s, trees, threads, times_s}, version} (or skipped/error); the raw
result's threads.
"""

from __future__ import annotations

from typing import Any

from ..base import FAIL, PASS, Check, _problem, grade

NAME = "gbdt"

GBDT_GRADES = (0.3, 0.15)  # 1 -> 16 cores: only 5-7x (memory-bound); below 0.15 extra threads are wasted


def gbdt_checks(raw: dict[str, Any], gbdt: dict[str, Any]) -> list[Check]:
    problem = _problem("gbdt", "gradient boosting", "gradient boosting", gbdt)
    if problem:
        return [problem]
    out = []
    for lib in ("xgboost", "lightgbm", "catboost"):
        res = gbdt.get(lib) or {}
        cid, title = f"gbdt.{lib}", f"{lib} hist training"
        problem = _problem(cid, "gradient boosting", title, res)
        if problem:
            out.append(problem)
            continue
        allc, one = res["all"], res["one"]
        cores = int(raw.get("threads") or 1)
        fig = allc["row_trees_per_s"] / 1e6
        limit = one["row_trees_per_s"] * cores / 1e6
        ratio = fig / limit
        speedup = allc["row_trees_per_s"] / one["row_trees_per_s"]
        status = grade(ratio, GBDT_GRADES)
        if speedup < 1:
            status = FAIL
        reason = f"1 -> {cores} cores: {speedup:.1f}x ({ratio:.0%} of linear)"
        if status != PASS:
            reason += "; more threads barely help: oversubscription, a thread cap, or memory-bound"
        detail = (
            f"{gbdt.get('rows'):,} x {gbdt.get('cols')}, depth {gbdt.get('depth')}, {allc['trees']} trees on "
            f"{allc['threads']} threads, {one['trees']} on 1; median of {len(allc.get('times_s', []))}; "
            f"{lib} {res.get('version')}"
        )
        basis = f"the one-core rate ({one['row_trees_per_s'] / 1e6:.2f} M row-trees/s) x {cores} cores (linear scaling)"
        out.append(
            Check(cid, "gradient boosting", title, status, reason, fig, "M row-trees/s", limit, basis, ratio, detail=detail)
        )
    return out


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return gbdt_checks(raw, result)
