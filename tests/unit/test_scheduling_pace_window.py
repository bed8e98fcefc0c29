"""The slowest pace an instance reported over its last committing steps."""

from __future__ import annotations

import pytest

from specbatch.scheduling.pace_window import RecentPaces


def test_the_slowest_pace_of_the_window_holds_until_its_step_leaves_the_window():
    paces = RecentPaces(window_steps=4)
    for steps, pace in ((1, 0.01), (2, 0.03), (3, 0.01), (5, 0.01)):
        paces.record(steps, pace)
    assert paces.slowest_s() == 0.03, "steps 2 to 5 are the last four"
    paces.record(6, 0.012)
    assert paces.slowest_s() == 0.012


def test_a_long_gap_between_reports_leaves_only_the_steps_within_the_window():
    paces = RecentPaces(window_steps=64)
    paces.record(10, 0.05)
    paces.record(200, 0.01)
    assert paces.slowest_s() == 0.01


def test_a_later_report_of_the_same_step_replaces_the_earlier_one():
    paces = RecentPaces(window_steps=8)
    paces.record(7, 0.02)
    paces.record(7, 0.015)
    assert paces.slowest_s() == 0.015


def test_an_engine_started_again_forgets_the_paces_of_its_former_run():
    paces = RecentPaces(window_steps=64)
    paces.record(500, 0.05)
    paces.record(3, 0.01)
    assert paces.slowest_s() == 0.01


def test_an_unmeasured_pace_is_not_recorded_and_a_window_of_one_step_is_the_pace_now():
    paces = RecentPaces(window_steps=1)
    paces.record(0, 0.0)
    assert paces.slowest_s() == 0.0
    paces.record(1, 0.05)
    paces.record(2, 0.01)
    assert paces.slowest_s() == 0.01
    with pytest.raises(ValueError, match="at least 1"):
        RecentPaces(window_steps=0)
