"""Single-row predict latency in-process: p50 reported, p99 against what an endpoint can afford.

Runs on the control node. Reads results.inference: p50_us, p99_us, p50_us_each, p99_us_each,
library, trees, depth, repeats, calls, threads.
"""

from __future__ import annotations

from typing import Any

from ..base import FAIL, INFO, PASS, WARN, Check, _problem, span

NAME = "inference"

# Single-row predict: p99 within 2 ms passes (endpoints answer in 1-20 ms), within 10 ms warns.
LATENCY_P99_US = (2000.0, 10000.0)


def inference_checks(inf: dict[str, Any]) -> list[Check]:
    title = "single-row predict latency"
    problem = _problem("inference.p99", "inference", title, inf)
    if problem:
        return [problem]
    detail = (
        f"{inf['library']}, {inf['trees']} trees depth {inf['depth']}, median of {inf.get('repeats', 1)} x "
        f"{inf['calls']} calls, threads {inf['threads']}"
    )
    ok, warn = LATENCY_P99_US
    p99 = inf["p99_us"]
    status = PASS if p99 <= ok else WARN if p99 <= warn else FAIL
    basis = f"an endpoint answers in 1-20 ms: the model's p99 within {ok / 1000:.0f} ms passes, within {warn / 1000:.0f} ms warns"
    return [
        Check(
            "inference.p50",
            "inference",
            "single-row predict p50",
            INFO,
            "median latency in-process",
            inf["p50_us"],
            "µs",
            higher_is_better=False,
            detail=detail,
        ),
        Check(
            "inference.p99",
            "inference",
            "single-row predict p99",
            status,
            f"p99 {p99:,.0f} µs ({p99 / ok:.0%} of the budget)",
            p99,
            "µs",
            ok,
            basis,
            p99 / ok,
            higher_is_better=False,
            detail=detail,
        ),
    ]


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return inference_checks(result)


def spreads(inf: dict[str, Any]) -> dict[str, list[float] | None]:
    """The p50 and p99 of each repeat."""
    return {f"inference.{q}": span(inf[f"{q}_us_each"]) for q in ("p50", "p99") if inf.get(f"{q}_us_each")}
