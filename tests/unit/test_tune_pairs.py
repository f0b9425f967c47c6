"""The paired-gain rule on simulated noisy figures: a box whose speed drifts, noise on every figure
and now and then a neighbour that halves one measurement. A value with no effect is never kept; a
real 20% gain always is; pairs run in alternating order; a clear loser is dropped early."""

from __future__ import annotations

import math
import random

import pytest

from provisioner.tune import pairs

SEEDS = range(400)
QUIET = {"noise": 0.03, "drift": 0.01, "outliers": 0.02}
NOISY = {"noise": 0.05, "drift": 0.02, "outliers": 0.05}


def box(seed: int, effect: float, noise: float, drift: float, outliers: float):
    """measure_rule and measure_candidate of one simulated box: a figure of 100 (higher is better)
    times the box's speed (a random walk of DRIFT a step), NOISE on every figure, and a figure halved
    with probability OUTLIERS; the candidate's true figure is EFFECT times the rule's. Also returns
    the order the figures were asked for in."""
    rng = random.Random(seed)
    speed = [1.0]
    order: list[str] = []

    def figure(true: float, who: str) -> float:
        order.append(who)
        speed[0] *= math.exp(rng.gauss(0, drift))
        value = true * speed[0] * math.exp(rng.gauss(0, noise))
        return value * 0.5 if rng.random() < outliers else value

    return (lambda: figure(100.0, "rule")), (lambda: figure(100.0 * effect, "candidate")), order


def kept(effect: float, model: dict, seeds=SEEDS) -> list[int]:
    return [s for s in seeds if pairs.compare(*box(s, effect, **model)[:2]).kept]


def test_on_a_quiet_box_no_effect_is_never_kept_and_a_real_gain_always_is():
    assert kept(1.0, QUIET) == []
    assert len(kept(1.02, QUIET)) <= len(SEEDS) // 100  # a real 2%, inside the margin: seldom
    assert len(kept(1.2, QUIET)) == len(SEEDS)


def test_on_a_noisy_box_few_false_gains_and_most_real_ones():
    assert len(kept(1.0, NOISY)) <= len(SEEDS) // 100
    assert len(kept(1.2, NOISY)) >= 0.95 * len(SEEDS)


def test_a_loss_is_dropped_after_the_fewest_pairs_that_decide():
    verdicts = [pairs.compare(*box(s, 0.8, **QUIET)[:2]) for s in range(50)]
    assert not any(v.kept for v in verdicts)
    assert all(v.pairs == pairs.MIN_PAIRS and v.gain < 1 and "dropped" in v.reason for v in verdicts)


def test_a_kept_value_is_measured_in_every_pair_and_its_gain_is_the_real_one():
    verdicts = [pairs.compare(*box(s, 1.2, **QUIET)[:2]) for s in range(50)]
    assert all(v.pairs == pairs.MAX_PAIRS for v in verdicts)
    gains = sorted(v.gain for v in verdicts)
    assert 1.17 < gains[len(gains) // 2] < 1.23
    assert all(v.low <= v.gain for v in verdicts)


def test_lower_is_better_figures_are_turned_around():
    latency = pairs.compare(lambda: 10.0, lambda: 8.0, higher_is_better=False)  # 20% less time
    assert latency.kept and latency.median == pytest.approx(1.25) and latency.outliers == 0
    assert not pairs.compare(lambda: 10.0, lambda: 12.0, higher_is_better=False).kept


def test_pairs_run_in_alternating_order():
    rule, candidate, order = box(0, 1.2, **QUIET)
    pairs.compare(rule, candidate)
    assert order[:8] == ["rule", "candidate", "candidate", "rule", "rule", "candidate", "candidate", "rule"]
    assert len(order) == 2 * pairs.MAX_PAIRS


def test_a_pair_a_neighbour_disturbed_is_left_out_of_the_gain_but_kept_in_the_evidence():
    ratios = [1.2, 1.21, 1.19, 0.6, 1.2, 1.22, 1.18, 1.2, 1.21, 1.19, 1.2]
    verdict = pairs.judge(ratios)
    assert verdict.kept and verdict.outliers == 1 and verdict.ratios == tuple(ratios)
    assert verdict.gain == pytest.approx(1.2, abs=0.005)


def test_the_verdict_says_why():
    assert "only 3 pair(s)" in pairs.judge([1.3, 1.3, 1.3]).reason
    assert "undecided: 7 of 11" in pairs.judge([1.3] * 4 + [1.31, 1.29, 1.3]).reason
    noise = pairs.judge([1.1, 0.95, 1.02, 0.99, 1.05, 1.08, 0.97, 1.0, 1.04, 0.98, 1.06])
    assert not noise.kept and "within the noise" in noise.reason
    assert 0 < noise.spread < 0.2
    with pytest.raises(ValueError, match="positive"):
        pairs.ratio(0, 1)
    with pytest.raises(ValueError, match="no pairs"):
        pairs.judge([])
