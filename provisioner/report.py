"""The self-contained HTML smoke report: one file, inline CSS and SVG charts, no scripts."""

from __future__ import annotations

import html
import math
import time
from pathlib import Path
from typing import Any

import jinja2

from .metrics import FIGURE, LIMIT, RATIO, STATUS
from .smoke import SERVING_P99_MS, HostReport, number

TEMPLATES = Path(__file__).resolve().parent / "templates"
COLORS = {"pass": "#2e7d32", "warn": "#ef6c00", "fail": "#c62828", "skip": "#9e9e9e", "info": "#1565c0"}


def ratio_bar(ratio: float | None, status: str, width: int = 260, height: int = 18) -> str:
    """An SVG bar of figure / limit with a mark at the limit (1.0); lower-is-better ratios too."""
    if ratio is None:
        return ""
    top = max(1.25, min(ratio, 3.0) * 1.05)
    w = width * min(ratio, 3.0) / top
    mark = width / top
    return (
        f'<svg class="bar" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{ratio:.2f} of the limit">'
        f'<rect x="0" y="3" width="{width}" height="{height - 6}" fill="#eceff1"/>'
        f'<rect x="0" y="3" width="{w:.1f}" height="{height - 6}" fill="{COLORS.get(status, "#607d8b")}"/>'
        f'<line x1="{mark:.1f}" x2="{mark:.1f}" y1="0" y2="{height}" stroke="#212121" stroke-width="2"/>'
        f"<title>{ratio:.2f} of the limit (line: the limit)</title></svg>"
    )


def before_after(before: float | None, after: float | None, gain: float | None, width: int = 200) -> str:
    """Two SVG bars, before (grey) and after (blue), on one scale."""
    if before is None or after is None or not gain:
        return ""
    top = max(before, after) or 1.0
    b, a = width * before / top, width * after / top
    return (
        f'<svg class="bar" width="{width}" height="30" viewBox="0 0 {width} 30" role="img" '
        f'aria-label="before {before:.4g}, after {after:.4g}">'
        f'<rect x="0" y="2" width="{b:.1f}" height="11" fill="#b0bec5"/>'
        f'<rect x="0" y="17" width="{a:.1f}" height="11" fill="#1565c0"/>'
        f"<title>before {before:.4g}, after {after:.4g}: {gain:.2f}x</title></svg>"
    )


CURVE_COLORS = {"tuned": "#1565c0", "baseline": "#78909c"}


def latency_chart(
    curves: dict[str, list[dict[str, Any]]], budget_ms: float = SERVING_P99_MS[0], width: int = 560, height: int = 280
) -> str:
    """An SVG chart of the model server's latency (p50 solid, p99 dashed) against load (connections),
    one colour per mode (tuned, baseline), both axes logarithmic, the p99 budget as a red line."""
    points = [p for curve in curves.values() for p in curve]
    if not points:
        return ""
    left, right, top, bottom = 56, 150, 14, 40
    pw, ph = width - left - right, height - top - bottom
    conns = sorted({int(p["connections"]) for p in points})
    lows = [v for p in points for v in (p["p50_ms"], p["p99_ms"]) if v and v > 0] + [budget_ms]
    y_lo = 10 ** math.floor(math.log10(min(lows)))
    y_hi = 10 ** math.ceil(math.log10(max(lows) * 1.05))
    x_lo, x_hi = math.log2(conns[0]), math.log2(conns[-1])

    def x(c: float) -> float:
        return left + (pw / 2 if x_hi == x_lo else pw * (math.log2(c) - x_lo) / (x_hi - x_lo))

    def y(ms: float) -> float:
        return top + ph * (1 - (math.log10(max(ms, y_lo)) - math.log10(y_lo)) / (math.log10(y_hi) - math.log10(y_lo)))

    parts = [
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="latency against load">',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#cfd8dc"/>',
    ]
    tick = y_lo
    while tick <= y_hi * 1.001:
        label = f"{tick:g} ms"
        parts.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#eceff1"/>'
            f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end" font-size="11" fill="#616161">{label}</text>'
        )
        tick *= 10
    for c in conns:
        parts.append(f'<text x="{x(c):.1f}" y="{top + ph + 16}" text-anchor="middle" font-size="11" fill="#616161">{c}</text>')
    parts.append(
        f'<text x="{left + pw / 2:.1f}" y="{height - 6}" text-anchor="middle" font-size="12" fill="#424242">'
        f"concurrent connections (wrk)</text>"
    )
    parts.append(
        f'<line x1="{left}" x2="{left + pw}" y1="{y(budget_ms):.1f}" y2="{y(budget_ms):.1f}" stroke="#c62828" '
        f'stroke-dasharray="2 3"><title>the p99 budget: {budget_ms:g} ms</title></line>'
    )
    legend_y = top + 4
    for mode, curve in curves.items():
        color = CURVE_COLORS.get(mode, "#6a1b9a")
        for key, dash, name in (("p50_ms", "", "p50"), ("p99_ms", ' stroke-dasharray="6 4"', "p99")):
            pts = [(x(p["connections"]), y(p[key]), p) for p in curve if p.get(key)]
            if not pts:
                continue
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py, _ in pts)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
            for px, py, p in pts:
                parts.append(
                    f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{color}"><title>{html.escape(mode)} {name} at '
                    f"{p['connections']} connections: {p[key]:.2f} ms ({p.get('requests_per_s') or 0:,.0f} requests/s)"
                    f"</title></circle>"
                )
            parts.append(
                f'<line x1="{left + pw + 12}" x2="{left + pw + 40}" y1="{legend_y:.1f}" y2="{legend_y:.1f}" '
                f'stroke="{color}" stroke-width="2"{dash}/><text x="{left + pw + 46}" y="{legend_y + 4:.1f}" '
                f'font-size="11" fill="#424242">{html.escape(mode)} {name}</text>'
            )
            legend_y += 18
    parts.append(
        f'<line x1="{left + pw + 12}" x2="{left + pw + 40}" y1="{legend_y:.1f}" y2="{legend_y:.1f}" stroke="#c62828" '
        f'stroke-dasharray="2 3"/><text x="{left + pw + 46}" y="{legend_y + 4:.1f}" font-size="11" fill="#424242">'
        f"p99 budget</text>"
    )
    parts.append("<title>model server latency against load</title></svg>")
    return "".join(parts)


def render_html(reports: list[HostReport]) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined)
    env.globals.update(
        ratio_bar=ratio_bar,
        before_after=before_after,
        latency_chart=latency_chart,
        colors=COLORS,
        metrics=(FIGURE, LIMIT, RATIO, STATUS),
    )
    env.filters["num"] = number
    return env.get_template("report.html.j2").render(
        reports=[r.to_dict() for r in reports],
        generated=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    )


def write_html(reports: list[HostReport], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(reports), encoding="utf-8")
    return path


def pairs_chart(ratios: list[float], margin: float, kept: bool, width: int = 320, height: int = 90) -> str:
    """An SVG of one candidate's pair ratios in the order measured (above 1: the candidate was better),
    the line at 1 and the keep margin dashed."""
    if not ratios:
        return ""
    lo, hi = min(0.8, *ratios) * 0.98, max(1.2, *ratios) * 1.02
    left, pad = 8, 8
    step = (width - 2 * left) / max(1, len(ratios) - 1)

    def y(v: float) -> float:
        return pad + (height - 2 * pad) * (hi - v) / (hi - lo)

    color = COLORS["pass"] if kept else "#607d8b"
    parts = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">']
    parts.append(f'<line x1="0" x2="{width}" y1="{y(1.0):.1f}" y2="{y(1.0):.1f}" stroke="#212121"/>')
    parts.append(f'<line x1="0" x2="{width}" y1="{y(margin):.1f}" y2="{y(margin):.1f}" stroke="#2e7d32" stroke-dasharray="4 3"/>')
    for i, r in enumerate(ratios):
        parts.append(
            f'<circle cx="{left + i * step:.1f}" cy="{y(r):.1f}" r="4" fill="{color}"><title>pair {i + 1}: {r:.3f}</title></circle>'
        )
    parts.append(f"<title>{len(ratios)} pairs, candidate over rule (line: 1, dashed: {margin})</title></svg>")
    return "".join(parts)


def write_tune_html(outcome: Any, path: Path) -> Path:
    """The tune report: per host, each knob's rule and tuned value, the gain and its spread, and
    every candidate's pairs as a chart."""
    from .tune.pairs import MARGIN

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined)
    env.globals.update(pairs_chart=pairs_chart, margin=MARGIN)
    text = env.get_template("tune.html.j2").render(
        rows=outcome.rows,
        results=outcome.results,
        classes=outcome.classes,
        generated=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
