"""The cost view: with the host's monthly price, its measured serving and trial throughput in
dollars, next to cloud instances of the same class (docs/tuning.md, 'Cost').

Runs on the control node. Reads the raw result's cost {price_per_month, cloud_prices} and the
serving.rps, serving.errors and hpo.parallel checks already judged.
"""

from __future__ import annotations

from typing import Any

from .base import FAIL, INFO, Check, number

# A month of a host's price is this many hours; cost checks follow the figure named here (their
# before -> after is that figure's, at this run's price).
HOURS_PER_MONTH = 730.0
COST_SOURCES = {"cost.serving.": "serving.rps", "cost.hpo.": "hpo.parallel"}


def hourly_price(price_per_month: float) -> float:
    """A monthly price per hour: a month is HOURS_PER_MONTH (730) hours."""
    return price_per_month / HOURS_PER_MONTH


def cost_per_million(requests_per_s: float, price_per_hour: float) -> float:
    """$ per million predictions: the hours a million requests take at this rate, times the hourly price."""
    return 1e6 / requests_per_s * price_per_hour / 3600


def cost_per_trial(trials_per_min: float, price_per_hour: float) -> float:
    """$ per trial: an hour's price over the trials an hour holds."""
    return price_per_hour / (trials_per_min * 60)


def cost_checks(cost: dict[str, Any], checks: list[Check]) -> list[Check]:
    """With the host's monthly price: its measured serving and trial throughput in dollars, and the
    same throughput at each cloud instance's on-demand price (an instance of the class doing what
    this host did). Nothing without a price."""
    price = cost.get("price_per_month")
    if not price or price <= 0:
        return []
    hourly = hourly_price(float(price))
    clouds = {str(k): float(v) for k, v in (cost.get("cloud_prices") or {}).items() if v and float(v) > 0}
    by = {c.id: c for c in checks}
    out = []
    for key, source, unit, fn, what in (
        ("serving", "serving.rps", "$/1M predictions", cost_per_million, "requests/s"),
        ("hpo", "hpo.parallel", "$/trial", cost_per_trial, "trials/min"),
    ):
        src = by.get(source)
        if src is None or not src.figure:
            continue
        if key == "serving" and by.get("serving.errors") and by["serving.errors"].status == FAIL:
            continue  # failed requests are no predictions
        here = fn(src.figure, hourly)
        basis = f"{number(src.figure)} {what} measured ({src.title}) at ${price:,.2f} a month = ${hourly:.4f}/h ({HOURS_PER_MONTH:.0f} h)"
        title = "$ per 1M predictions" if key == "serving" else "$ per trial"
        out.append(Check(f"cost.{key}.host", "cost", f"{title}, this host", INFO, basis, here, unit, higher_is_better=False))
        for name, per_hour in clouds.items():
            there = fn(src.figure, per_hour)
            out.append(
                Check(
                    f"cost.{key}.{name}",
                    "cost",
                    f"{title}, {name}",
                    INFO,
                    f"the same {number(src.figure)} {what} at ${per_hour:.3f}/h on demand: {there / here:.2f}x this host's cost",
                    there,
                    unit,
                    higher_is_better=False,
                )
            )
    return out
