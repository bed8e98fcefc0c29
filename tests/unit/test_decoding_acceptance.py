"""How far a row's own acceptance count moves its estimate off the instance's: measured
from how far ended rows spread beyond what their counts alone explain."""

from __future__ import annotations

import random

import pytest

from specbatch.decoding.rows import (
    ALPHA_PRIOR_WEIGHT,
    ROW_PRIOR_WEIGHT_MAX,
    ROW_PRIOR_WEIGHT_START,
    ROW_TRIALS_MIN,
    ROWS_MEASURED,
    AcceptanceTracker,
    row_prior_weight,
)


def _row(alpha: float, trials: int, rng: random.Random) -> tuple[int, int]:
    """(accepted, trials) of a row whose draft tokens are accepted with probability α."""
    return sum(rng.random() < alpha for _ in range(trials)), trials


def test_rows_of_one_acceptance_weigh_the_instance_most():
    rng = random.Random(0)
    rows = [_row(0.9, rng.randint(20, 200), rng) for _ in range(64)]
    assert row_prior_weight(rows) >= 50


def test_rows_that_really_differ_weigh_their_own_counts():
    rng = random.Random(1)
    rows = [_row(rng.choice((0.4, 0.9)), 400, rng) for _ in range(64)]
    # α spread ±0.25 about 0.65: a beta prior of that spread weighs about 2.6 tokens
    assert row_prior_weight(rows) == ALPHA_PRIOR_WEIGHT


def test_the_weight_follows_the_spread_between_rows():
    rng = random.Random(2)
    rows = [_row(rng.uniform(0.7, 0.9), 2000, rng) for _ in range(64)]
    # α uniform on [0.7, 0.9]: variance 0.2²/12, mean 0.8, so 0.16 / 0.00333 - 1 = 47
    assert 25 <= row_prior_weight(rows) <= 75


def test_the_tracker_measures_once_enough_rows_with_enough_draft_tokens_have_ended():
    tracker = AcceptanceTracker()
    assert tracker.row_prior_weight == ROW_PRIOR_WEIGHT_START
    for _ in range(2 * ROWS_MEASURED):
        tracker.row_ended(1, ROW_TRIALS_MIN - 2)  # too few draft tokens to say anything
    assert tracker.row_prior_weight == ROW_PRIOR_WEIGHT_START
    rng = random.Random(3)
    for _ in range(ROWS_MEASURED):
        accepted, trials = _row(0.9, 100, rng)
        tracker.row_ended(accepted, trials - accepted)
    assert tracker.row_prior_weight == pytest.approx(ROW_PRIOR_WEIGHT_MAX, rel=0.5)
