"""The paired-gain rule: when a candidate value beats the plan's rule by more than the noise.

These machines are noisy (run-to-run spreads of 5-30% on two shared cores, docs/tuning.md), and
they drift: a neighbour starts, the clock drops, the page cache fills. A candidate is therefore
never compared with a figure measured earlier, only within pairs measured back to back: each pair
runs the rule and the candidate one after the other, in alternating order (rule first, then
candidate first: a steady drift favours neither), and gives one ratio, candidate over rule,
oriented so that above 1 is better whichever way the figure points.

The ratios are judged on their logarithms, after leaving out a pair far from the others (more than
three robust standard deviations, and over 5%, from their median: a neighbour that halved one
figure). A candidate is kept when the mean gain minus three standard errors is above MARGIN and
the lower quartile of all its ratios is too, after MAX_PAIRS pairs; it is dropped as soon as, from
MIN_PAIRS on, the mean plus three standard errors cannot reach MARGIN. Simulated
(tests/unit/test_tune_pairs.py): on a box with 3% noise per figure, 1% drift a step and 2% of
figures halved, a value with no effect is never kept over 400 seeds and a real 20% gain always
is; at 5% noise, 2% drift and 5% halved, fewer than 1% of no-effect values are kept and 95% of
20% gains.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MARGIN = 1.03
MIN_PAIRS = 5
MAX_PAIRS = 11
Z = 3.0  # standard errors between the mean gain and MARGIN
OUTLIER_SIGMAS = 3.0
OUTLIER_FLOOR = 0.05  # a pair within 5% of the median is never an outlier


@dataclass(frozen=True)
class Verdict:
    kept: bool
    ratios: tuple[float, ...]  # candidate over rule per pair, above 1 better, in the order measured
    gain: float  # exp(mean log ratio) of the pairs kept for the mean
    low: float  # the gain minus Z standard errors (as a ratio)
    q1: float
    median: float
    q3: float
    outliers: int
    reason: str

    @property
    def pairs(self) -> int:
        return len(self.ratios)

    @property
    def spread(self) -> float:
        """The interquartile range relative to the median (0.04: 4%)."""
        return (self.q3 - self.q1) / self.median if self.median else 0.0


def ratio(rule: float, candidate: float, higher_is_better: bool = True) -> float:
    """One pair's ratio, above 1 when the candidate is better."""
    if rule <= 0 or candidate <= 0:
        raise ValueError(f"figures must be positive to compare: rule {rule}, candidate {candidate}")
    return candidate / rule if higher_is_better else rule / candidate


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """Lower quartile, median and upper quartile (inclusive method: within the data's own range)."""
    if not values:
        raise ValueError("no pairs measured")
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def _without_outliers(logs: Sequence[float]) -> list[float]:
    median = statistics.median(logs)
    mad = statistics.median([abs(x - median) for x in logs])
    limit = max(OUTLIER_SIGMAS * 1.4826 * mad, OUTLIER_FLOOR)
    return [x for x in logs if abs(x - median) <= limit]


def _bounds(ratios: Sequence[float]) -> tuple[float, float, int]:
    """(mean log gain, its standard error, the count of pairs left out as outliers)."""
    kept = _without_outliers([math.log(r) for r in ratios])
    mean = statistics.fmean(kept)
    se = statistics.stdev(kept) / math.sqrt(len(kept)) if len(kept) > 1 else math.inf
    return mean, se, len(ratios) - len(kept)


def _cannot_reach(ratios: Sequence[float], margin: float) -> bool:
    mean, se, _ = _bounds(ratios)
    return math.exp(mean + Z * se) < margin


def judge(ratios: Sequence[float], margin: float = MARGIN) -> Verdict:
    """The verdict on the pairs measured: kept only after MAX_PAIRS pairs, with the mean gain minus Z
    standard errors and the lower quartile both above MARGIN."""
    if not ratios:
        raise ValueError("no pairs measured")
    q1, median, q3 = quartiles(ratios)
    mean, se, outliers = _bounds(ratios)
    low = math.exp(mean - Z * se) if math.isfinite(se) else 0.0
    gain = math.exp(mean)
    n = len(ratios)
    if n < MIN_PAIRS:
        reason, kept = f"only {n} pair(s): {MIN_PAIRS} are the fewest that decide", False
    elif _cannot_reach(ratios, margin):
        reason, kept = f"gain {gain:.3f} cannot reach {margin} in {n} pairs: dropped", False
    elif n < MAX_PAIRS:
        reason, kept = f"undecided: {n} of {MAX_PAIRS} pairs measured", False
    elif low > margin and q1 > margin:
        reason, kept = f"gain {gain:.3f}, at least {low:.3f} (lower quartile {q1:.3f}) above {margin} in {n} pairs", True
    else:
        reason, kept = f"gain {gain:.3f} not surely above {margin} in {n} pairs (at least {low:.3f}): within the noise", False
    return Verdict(kept, tuple(ratios), gain, low, q1, median, q3, outliers, reason)


def compare(
    measure_rule: Callable[[], float],
    measure_candidate: Callable[[], float],
    higher_is_better: bool = True,
    margin: float = MARGIN,
) -> Verdict:
    """Measure pairs in alternating order until the rule decides: dropped from MIN_PAIRS on once the gain
    cannot reach MARGIN, else MAX_PAIRS pairs and the verdict on all of them."""
    verdict, _ = compare_within(measure_rule, measure_candidate, higher_is_better, margin)
    if verdict is None:
        raise ValueError("no pairs measured")
    return verdict


def decided(ratios: Sequence[float], margin: float = MARGIN) -> bool:
    """Whether these pairs decide: MAX_PAIRS of them, or from MIN_PAIRS on a gain that cannot reach MARGIN."""
    return len(ratios) >= MAX_PAIRS or (len(ratios) >= MIN_PAIRS and _cannot_reach(ratios, margin))


def compare_within(
    measure_rule: Callable[[], float],
    measure_candidate: Callable[[], float],
    higher_is_better: bool = True,
    margin: float = MARGIN,
    *,
    ratios: Sequence[float] = (),
    on_pair: Callable[[list[float]], None] | None = None,
    go_on: Callable[[], bool] | None = None,
) -> tuple[Verdict | None, bool]:
    """`compare`, resumed from the RATIOS an earlier run measured, calling ON_PAIR with all of them after
    each pair, and beginning a pair only while GO_ON() says there is time: (the verdict on the pairs
    measured, None for none; whether they decide)."""
    got = list(ratios)
    while not decided(got, margin) and (go_on is None or go_on()):
        if len(got) % 2 == 0:
            rule = measure_rule()
            candidate = measure_candidate()
        else:
            candidate = measure_candidate()
            rule = measure_rule()
        got.append(ratio(rule, candidate, higher_is_better))
        if on_pair is not None:
            on_pair(got)
    return (judge(got, margin) if got else None), decided(got, margin)
