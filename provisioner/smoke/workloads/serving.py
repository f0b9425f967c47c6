"""The model server under HTTP load (wrk at 1, 8 and 32 connections): requests/s at 8 against the
in-process predict rate x the physical cores, p99 against what an endpoint can afford, no failed
request at any level; the other levels and the in-process rate reported.

Runs on the control node. Reads results.serving: levels [{connections, requests_per_s, p50_ms,
p99_ms, runs, seconds, requests, socket_errors, non_2xx}], inproc {per_s, p50_us, p99_us, how,
repeats, calls}, inproc_error, model, model_name, target, workers_how; the raw result's
cpu.physical_cores.
"""

from __future__ import annotations

from typing import Any

from ..base import FAIL, INFO, PASS, WARN, Check, _problem, against_limit, span

NAME = "serving"

# The model server at SERVING_CONNECTIONS concurrent connections: requests/s against the
# in-process predict rate x the physical cores (pass, warn); p99 in ms (pass within, warn within).
SERVING_CONNECTIONS = 8
SERVING_GRADES = (0.2, 0.08)
SERVING_P99_MS = (20.0, 50.0)


def serving_level(serving: dict[str, Any], connections: int = SERVING_CONNECTIONS) -> dict[str, Any] | None:
    """The wrk figures of the model server at `connections` concurrent connections, if measured."""
    return next((lv for lv in serving.get("levels") or [] if lv.get("connections") == connections), None)


def serving_curve(serving: dict[str, Any]) -> list[dict[str, Any]]:
    """Latency against load: one point per connection level, fewest connections first."""
    points = [
        {k: lv.get(k) for k in ("connections", "requests_per_s", "p50_ms", "p99_ms")}
        for lv in serving.get("levels") or []
        if lv.get("p50_ms") is not None and lv.get("p99_ms") is not None
    ]
    return sorted(points, key=lambda p: p["connections"])


def _failed_requests(serving: dict[str, Any]) -> list[str]:
    """Per level with any, its socket errors and non-2xx responses, as people read them."""
    out = []
    for lv in serving.get("levels") or []:
        errors, non2xx = int(lv.get("socket_errors") or 0), int(lv.get("non_2xx") or 0)
        if errors or non2xx:
            out.append(f"{lv.get('connections')} connections: {errors:,} socket errors, {non2xx:,} non-2xx")
    return out


def serving_checks(raw: dict[str, Any], serving: dict[str, Any]) -> list[Check]:
    """The model server under wrk: requests/s and p99 at 8 connections, failed requests at every level,
    the other levels and the in-process rate reported."""
    title = "model server requests/s"
    problem = _problem("serving.rps", "serving", title, serving)
    if problem:
        return [problem]
    level = serving_level(serving)
    if level is None or level.get("requests_per_s") is None:
        return [Check("serving.rps", "serving", title, FAIL, f"no figures at {SERVING_CONNECTIONS} connections")]
    model = serving.get("model") or {}
    target = serving.get("target", "throwaway")
    what = (
        f"{target} server, {serving.get('workers_how')}; "
        f"{serving.get('model_name') or 'smoke/1'} {model.get('framework', '')} "
        + (f"{model.get('trees')} trees depth {model.get('depth')}, " if model.get("trees") else "")
        + f"{model.get('features')} features"
    )
    runs = len(level.get("runs") or [1])
    detail = f"{what}; wrk -t1, {level.get('seconds')} s x {runs} per level, one JSON row per POST"
    short = f"{target} server, wrk at {SERVING_CONNECTIONS} connections"
    failed = _failed_requests(serving)
    cores = int(raw.get("cpu", {}).get("physical_cores") or 1)
    inproc = (serving.get("inproc") or {}).get("per_s")
    rps = float(level["requests_per_s"])
    p50 = level.get("p50_ms")
    out = []
    if inproc:
        limit = inproc * cores
        ratio = rps / limit
        reason = (
            f"{ratio:.0%} of the in-process rate x {cores} cores (the HTTP layer and the load generator on the same "
            f"cores take the rest); p50 {p50:.2f} ms"
        )
        status, reason = against_limit(
            ratio,
            SERVING_GRADES,
            reason,
            "the in-process rate",
            "too few workers, threads fighting over the cores, or a worker off its CPU slice",
        )
        basis = (
            f"the in-process predict rate through the server's loader and predict path ({inproc:,.0f}/s, one thread) "
            f"x {cores} physical cores"
        )
        rps_check = Check("serving.rps", "serving", title, status, reason, rps, "requests/s", limit, basis, ratio, detail=detail)
    else:
        why = serving.get("inproc_error") or "the in-process rate was not measured"
        rps_check = Check(
            "serving.rps", "serving", title, INFO, f"reported without a limit: {why}", rps, "requests/s", detail=detail
        )
    if failed:
        rps_check.status = FAIL
        rps_check.reason = f"failed requests under load ({'; '.join(failed)}); " + rps_check.reason
    out.append(rps_check)
    ok, warn = SERVING_P99_MS
    p99 = level.get("p99_ms")
    if p99 is not None:
        status = PASS if p99 <= ok else WARN if p99 <= warn else FAIL
        out.append(
            Check(
                "serving.p99",
                "serving",
                f"model server p99 at {SERVING_CONNECTIONS} connections",
                status,
                f"p99 {p99:.2f} ms ({p99 / ok:.0%} of the budget)"
                + ("" if status == PASS else "; requests queue behind busy workers: more workers, or fewer threads each"),
                p99,
                "ms",
                ok,
                f"an endpoint answers in 1-20 ms: p99 within {ok:.0f} ms passes, within {warn:.0f} ms warns",
                p99 / ok,
                higher_is_better=False,
                detail=short,
            )
        )
    total = sum(int(lv.get("requests") or 0) for lv in serving.get("levels") or [])
    bad = sum(int(lv.get("socket_errors") or 0) + int(lv.get("non_2xx") or 0) for lv in serving.get("levels") or [])
    out.append(
        Check(
            "serving.errors",
            "serving",
            "model server failed requests",
            FAIL if failed else PASS,
            "; ".join(failed)
            if failed
            else f"none of {total:,} requests at {', '.join(str(lv.get('connections')) for lv in serving.get('levels') or [])} connections",
            float(bad),
            "requests",
            basis="every request at every level answered 2xx",
            higher_is_better=False,
            detail=f"{target} server, wrk socket errors and non-2xx responses",
        )
    )
    for lv in serving.get("levels") or []:
        c = lv.get("connections")
        if c == SERVING_CONNECTIONS or lv.get("requests_per_s") is None:
            continue
        out.append(
            Check(
                f"serving.rps_c{c}",
                "serving",
                f"model server requests/s at {c} connection{'s' if c != 1 else ''}",
                INFO,
                f"p50 {lv.get('p50_ms') or 0:.2f} ms, p99 {lv.get('p99_ms') or 0:.2f} ms",
                float(lv["requests_per_s"]),
                "requests/s",
                detail=f"{target} server, wrk at {c} connection{'s' if c != 1 else ''}",
            )
        )
    if inproc:
        ip = serving["inproc"]
        out.append(
            Check(
                "serving.inproc",
                "serving",
                "in-process predict rate (one thread)",
                INFO,
                f"p50 {ip.get('p50_us', 0):,.0f} µs, p99 {ip.get('p99_us', 0):,.0f} µs per row",
                float(inproc),
                "predicts/s",
                detail=f"{ip.get('how')}; median of {ip.get('repeats')} x {ip.get('calls')} calls",
            )
        )
    return out


def checks(raw: dict[str, Any], result: dict[str, Any]) -> list[Check]:
    return serving_checks(raw, result)


def spreads(serving: dict[str, Any]) -> dict[str, list[float] | None]:
    """Requests/s and p99 of each wrk run at SERVING_CONNECTIONS."""
    level = serving_level(serving)
    out: dict[str, list[float] | None] = {}
    for key, cid in (("requests_per_s", "serving.rps"), ("p99_ms", "serving.p99")):
        values = [r[key] for r in (level or {}).get("runs", []) if r.get(key) is not None]
        out[cid] = span(values)
    return out
