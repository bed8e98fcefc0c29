"""Arrival schedules: the offered rate, its spacing, and burst phases, on a virtual clock."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest

from specbatch.loadtest.arrivals import ArrivalSchedule
from specbatch.loadtest.profiles import Arrival


def arrivals(schedule: ArrivalSchedule, count: int) -> list[float]:
    """Arrival instants of a user that is never late (it asks at each arrival)."""
    instants = []
    now = 0.0
    for _ in range(count):
        now += schedule.wait(now)
        instants.append(now)
    return instants


def test_constant_arrivals_are_evenly_spaced_at_users_over_rate():
    schedule = ArrivalSchedule(Arrival(shape="constant", rate=4.0), users=2, rng=random.Random(0))

    instants = arrivals(schedule, 6)

    assert 0.0 <= instants[0] < 0.5
    assert [b - a for a, b in itertools.pairwise(instants)] == pytest.approx([0.5] * 5)


def test_poisson_gaps_are_exponential_with_the_per_user_rate():
    schedule = ArrivalSchedule(Arrival(shape="poisson", rate=10.0), users=4, rng=random.Random(3))

    instants = arrivals(schedule, 20000)
    gaps = [b - a for a, b in itertools.pairwise([0.0, *instants])]

    assert statistics.fmean(gaps) == pytest.approx(0.4, rel=0.03)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.05)


def test_bursts_without_off_rate_arrive_only_in_on_phases_at_the_on_rate():
    arrival = Arrival(shape="bursts", on_rate=6.0, off_rate=0.0, on_s=2.0, off_s=3.0)
    schedule = ArrivalSchedule(arrival, users=3, rng=random.Random(5))

    instants = [t for t in arrivals(schedule, 8000) if t < 5000.0]

    assert all(t % 5.0 < 2.0 for t in instants)
    assert len(instants) == pytest.approx(1000 * 2.0 * 6.0 / 3, rel=0.05)


def test_bursts_with_off_rate_arrive_in_both_phases_at_their_rates():
    arrival = Arrival(shape="bursts", on_rate=10.0, off_rate=1.0, on_s=1.0, off_s=4.0)
    schedule = ArrivalSchedule(arrival, users=1, rng=random.Random(6))

    instants = [t for t in arrivals(schedule, 20000) if t < 5000.0]
    on = sum(1 for t in instants if t % 5.0 < 1.0)

    assert on == pytest.approx(1000 * 10.0, rel=0.05)
    assert len(instants) - on == pytest.approx(1000 * 4.0, rel=0.05)


def test_a_late_user_does_not_wait_and_keeps_its_timeline():
    schedule = ArrivalSchedule(Arrival(shape="constant", rate=1.0), users=1, rng=random.Random(0))
    first = schedule.next_at

    assert schedule.wait(first + 5.0) == 0.0
    assert schedule.wait(first + 5.0) == 0.0
    assert schedule.next_at == pytest.approx(first + 2.0)
    assert schedule.wait(first + 1.5) == pytest.approx(0.5)


def test_same_seed_same_arrivals():
    arrival = Arrival(shape="poisson", rate=3.0)

    first = arrivals(ArrivalSchedule(arrival, 2, random.Random(9)), 50)
    again = arrivals(ArrivalSchedule(arrival, 2, random.Random(9)), 50)

    assert first == again


def test_users_must_be_positive():
    with pytest.raises(ValueError, match="users must be >= 1"):
        ArrivalSchedule(Arrival(shape="poisson", rate=1.0), users=0, rng=random.Random(0))
