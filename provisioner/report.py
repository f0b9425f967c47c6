"""The self-contained HTML smoke report: one file, inline CSS and SVG charts, no scripts."""

from __future__ import annotations

import time
from pathlib import Path

import jinja2

from .metrics import FIGURE, LIMIT, RATIO, STATUS
from .smoke import HostReport, number

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


def render_html(reports: list[HostReport]) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined)
    env.globals.update(ratio_bar=ratio_bar, before_after=before_after, colors=COLORS, metrics=(FIGURE, LIMIT, RATIO, STATUS))
    env.filters["num"] = number
    return env.get_template("report.html.j2").render(
        reports=[r.to_dict() for r in reports],
        generated=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    )


def write_html(reports: list[HostReport], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(reports), encoding="utf-8")
    return path
