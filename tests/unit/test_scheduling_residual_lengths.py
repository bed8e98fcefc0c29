"""The mean residual of recent length-prediction errors: how much longer an overrunning row runs."""

from __future__ import annotations

import numpy as np
import pytest

from specbatch.scheduling.residual_lengths import ResidualLengths


def test_a_row_past_its_prediction_runs_on_by_the_mean_of_the_errors_beyond_its_overrun():
    lengths = ResidualLengths()
    for error in (-20, -5, 0, 40, 274, 274):
        lengths.add(error)
    assert lengths.mean_residual(0) == pytest.approx((40 + 274 + 274) / 3)
    assert lengths.mean_residual(100) == pytest.approx(174)
    assert lengths.mean_residual(-10) == pytest.approx((-5 + 0 + 40 + 274 + 274) / 5 + 10)


def test_no_residual_where_no_recent_row_ran_that_far_past_its_prediction():
    lengths = ResidualLengths()
    assert lengths.mean_residual(0) is None
    lengths.add(30)
    assert lengths.mean_residual(30) is None
    assert lengths.mean_residual(29) == pytest.approx(1)


def test_only_the_last_window_of_errors_counts():
    lengths = ResidualLengths(window=3)
    for error in (500, 10, 10, 10):
        lengths.add(error)
    assert lengths.mean_residual(0) == pytest.approx(10)
    assert lengths.mean_residual(10) is None


def test_the_residual_matches_a_direct_mean_over_a_random_window():
    rng = np.random.default_rng(0)
    errors = rng.normal(0, 80, size=700).round()
    lengths = ResidualLengths(window=256)
    for error in errors:
        lengths.add(float(error))
    recent = errors[-256:]
    for overrun in (-100.0, 0.0, 37.5, 150.0):
        beyond = recent[recent > overrun]
        assert lengths.mean_residual(overrun) == pytest.approx(beyond.mean() - overrun)
