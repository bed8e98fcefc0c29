"""Acceptance estimates read as what rows with such estimates went on to accept."""

from __future__ import annotations

import random

import pytest

from specbatch.decoding.calibration import CALIBRATION_PRIOR_TRIALS, AcceptanceCalibration


def _run(rng: random.Random, alpha: float, k: int) -> int:
    """Draft tokens accepted in one step of K = ``k`` when each is accepted with
    probability ``alpha``."""
    return next((i for i in range(k) if rng.random() >= alpha), k)


def test_an_estimate_is_taken_as_it_is_before_any_row_has_speculated() -> None:
    calibration = AcceptanceCalibration()
    calibration.record([0.9], [3], lookahead=0)  # a plain step tells nothing
    for estimate in (0.0, 0.13, 0.5, 0.9, 0.97, 1.0):
        assert calibration.calibrated(estimate) == estimate


def test_estimates_after_lucky_runs_read_as_what_the_rows_then_accept() -> None:
    # every row accepts each draft token with probability 0.8; its estimate is its own
    # last two steps, shrunk a little towards 0.8, so a lucky pair of runs reads 0.9+
    rng = random.Random(0)
    calibration = AcceptanceCalibration()
    history: list[tuple[int, int]] = []
    for _ in range(3000):
        accepted = sum(a for a, _ in history[-2:])
        trials = sum(t for _, t in history[-2:])
        estimate = (accepted + 2 * 0.8) / (trials + 2)
        taken = _run(rng, 0.8, 6)
        calibration.record([estimate], [taken], lookahead=6)
        history.append((taken, taken + (taken < 6)))
    assert calibration.calibrated(0.95) < 0.86, "the luckiest estimates are pulled down"
    assert calibration.calibrated(0.8) == pytest.approx(0.8, abs=0.03), "the mean estimate stays"
    assert calibration.calibrated(0.6) > 0.7, "the unluckiest are pulled up"


@pytest.mark.parametrize("alpha", [0.5, 0.9])
def test_an_estimate_that_is_right_stays_where_it_is(alpha: float) -> None:
    rng = random.Random(1)
    calibration = AcceptanceCalibration()
    for _ in range(2000):
        calibration.record([alpha] * 4, [_run(rng, alpha, 5) for _ in range(4)], lookahead=5)
    assert calibration.calibrated(alpha) == pytest.approx(alpha, abs=0.02)


def test_a_bands_offset_is_shrunk_by_the_evidence_it_rests_on() -> None:
    calibration = AcceptanceCalibration()
    calibration.record([0.925], [0], lookahead=4)  # one token verified, rejected
    assert calibration.offset(0.925) == pytest.approx(-0.925 / (1 + CALIBRATION_PRIOR_TRIALS))
    assert calibration.offset(0.95) == pytest.approx(-0.5 * 0.925 / (0.5 + CALIBRATION_PRIOR_TRIALS))
