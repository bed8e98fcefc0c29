"""Dynamic batch size: b_mem (Algorithm 1), the b_SLA controller (Algorithm 2), running statistics."""

from __future__ import annotations

import itertools
import math
import statistics
from statistics import NormalDist

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specbatch.scheduling.dynamic import RunningStats, SlaBatchController
from specbatch.scheduling.static import memory_batch_size


def test_running_stats_match_the_textbook_formulas() -> None:
    values = [3.0, 7.5, 1.25, 9.0, 4.0, 4.0, 12.5]
    stats = RunningStats()
    for value in values:
        stats.add(value)
    assert stats.count == len(values)
    assert stats.mean == pytest.approx(statistics.mean(values), rel=1e-12)
    assert stats.variance == pytest.approx(statistics.variance(values), rel=1e-12)


def test_b_mem_without_variance_is_capacity_over_mean() -> None:
    bound = memory_batch_size(10_000, 500.0, 0.0, eps_mem=0.05, b_min=1, b_max=1000)
    assert bound.b_mem == 20
    assert bound.margin_tokens == 0.0


def test_b_mem_reserves_the_clt_margin() -> None:
    # 500·b + θ·250·√b ≤ 20 000 with θ = Φ⁻¹(0.95): b = 35 fits (19 932.8), b = 36 does not (20 467).
    bound = memory_batch_size(20_000, 500.0, 250.0**2, eps_mem=0.05, b_min=1, b_max=1000)
    theta = NormalDist().inv_cdf(0.95)
    assert bound.b_mem == 35
    assert bound.margin_tokens == pytest.approx(theta * 250.0 * math.sqrt(35))
    assert bound.b_mem == math.floor((20_000 - bound.margin_tokens) / 500.0)


def test_b_mem_is_clamped_to_the_configured_range() -> None:
    assert memory_batch_size(100, 500.0, 0.0, eps_mem=0.05, b_min=2, b_max=64).b_mem == 2
    assert memory_batch_size(10**9, 500.0, 0.0, eps_mem=0.05, b_min=1, b_max=64).b_mem == 64


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(0, 200_000),
    mean=st.floats(1.0, 5_000.0),
    std=st.floats(0.0, 5_000.0),
    eps=st.floats(0.001, 0.3),
)
def test_b_mem_is_the_largest_size_within_the_tail_bound(
    capacity: int, mean: float, std: float, eps: float
) -> None:
    bound = memory_batch_size(capacity, mean, std * std, eps_mem=eps, b_min=1, b_max=10**9)
    theta = NormalDist().inv_cdf(1 - eps)

    def demand(b: int) -> float:
        return b * mean + theta * std * math.sqrt(b)

    if bound.b_mem > 1:
        assert demand(bound.b_mem) <= capacity + 1e-6 * capacity
    assert demand(bound.b_mem + 1) > capacity - 1e-6 * capacity


def _controller(**overrides: int) -> SlaBatchController:
    params = {"d_sla_s": 0.05, "eps_d_s": 0.005, "alpha": 4, "delta": 2, "b_min": 1, "b_max": 64, "window": 1}
    params.update(overrides)
    return SlaBatchController(**params)


def test_sla_controller_shrinks_the_batch_on_high_latency() -> None:
    controller = _controller()
    sizes = [controller.b_sla]
    for _ in range(12):
        sizes.append(controller.update(0.2, sizes[-1]))
    assert all(b < a for a, b in itertools.pairwise(sizes) if a > 1)
    assert sizes[-1] == 1


def test_sla_controller_grows_the_batch_on_low_latency() -> None:
    controller = _controller()
    sizes = [controller.b_sla]
    for _ in range(12):
        sizes.append(controller.update(0.001, sizes[-1]))
    assert all(b > a for a, b in itertools.pairwise(sizes) if a < 64)
    assert sizes[-1] == 64


def test_sla_controller_settles_where_latency_meets_the_target() -> None:
    # Latency 2 ms per row: the band 45–55 ms holds batch sizes 23..27.
    controller = _controller()
    size = controller.b_sla
    for _ in range(40):
        size = controller.update(0.002 * size, size)
    assert 23 <= size <= 27


def test_sla_controller_does_not_wind_up_on_small_batches() -> None:
    controller = _controller(b_max=1000)
    start = controller.b_sla
    for _ in range(50):
        controller.update(0.001, 2)
    assert controller.b_sla <= start
    assert controller.b_high == 1000


def test_sla_controller_averages_over_its_window() -> None:
    controller = _controller(window=3)
    controller.update(0.01, 10)
    controller.update(0.02, 10)
    controller.update(0.03, 10)
    controller.update(0.06, 10)
    assert controller.moving_latency_s == pytest.approx((0.02 + 0.03 + 0.06) / 3)


def test_sla_controller_learns_its_floor_at_the_smallest_batch_and_from_faster_windows() -> None:
    controller = _controller(window=2)
    assert controller.floor_s is None, "nothing measured at the smallest batch yet"
    controller.update(0.04, 16)
    assert controller.floor_s is None
    controller.update(0.02, 1)
    assert controller.floor_s == pytest.approx(0.02)
    controller.update(0.04, 1)
    assert controller.floor_s == pytest.approx(0.75 * 0.02 + 0.25 * 0.04)
    controller.update(0.01, 8)
    controller.update(0.01, 8)
    assert controller.floor_s == pytest.approx(0.01), "a full window at 8 rows ran faster"
