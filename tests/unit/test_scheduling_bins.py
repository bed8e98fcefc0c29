"""Bin layer: boundaries (fixed, explicit, equal-mass) and FIFO order within a bin."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specbatch.scheduling import PolicyConfigError, QueuedRequest
from specbatch.scheduling.bins import equal_mass_cuts, equally_spaced_cuts
from specbatch.scheduling.static import PolicyConfig, SchedulingPolicy


def _request(i: int, predicted: float, arrival: float = 0.0) -> QueuedRequest:
    return QueuedRequest(request_id=i, predicted_tokens=predicted, input_tokens=10, arrival_s=arrival)


def test_equally_spaced_cuts_split_the_range_evenly() -> None:
    assert equally_spaced_cuts(4, 0.0, 100.0) == [25.0, 50.0, 75.0]
    assert equally_spaced_cuts(1, 1.0, 20.0) == []


def test_equal_mass_cuts_are_the_empirical_quantiles() -> None:
    values = list(range(100))
    assert equal_mass_cuts(values, 4) == [25, 50, 75]


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(0, 10_000, allow_nan=False), min_size=40, max_size=400, unique=True),
    num_bins=st.integers(2, 8),
)
def test_equal_mass_cuts_give_each_bin_an_equal_share(values: list[float], num_bins: int) -> None:
    config = PolicyConfig(num_bins=num_bins, boundaries=equal_mass_cuts(values, num_bins), max_len=10_000)
    boundaries = config.bin_boundaries()
    counts = [0] * num_bins
    for value in values:
        counts[boundaries.assign(value)] += 1
    share = len(values) / num_bins
    assert all(abs(c - share) <= 1 for c in counts), counts


def test_equal_mass_boundaries_follow_recent_predictions_and_refresh_periodically() -> None:
    config = PolicyConfig(
        num_bins=2,
        boundaries="equal_mass",
        max_len=1000,
        boundary_window=10,
        boundary_refresh_every=5,
        boundary_min_samples=10,
    )
    boundaries = config.bin_boundaries()
    assert boundaries.cuts == [500.0]
    for value in range(10):
        boundaries.observe(value)
    assert boundaries.cuts == [5]
    for value in range(100, 104):
        boundaries.observe(value)
    assert boundaries.cuts == [5], "cuts change only on the refresh cadence"
    boundaries.observe(104)
    assert boundaries.cuts == [100], "window now holds 5..9 and 100..104"


def test_queued_requests_keep_their_bin_when_boundaries_move() -> None:
    config = PolicyConfig(
        num_bins=2,
        boundaries="equal_mass",
        max_len=1000,
        boundary_window=4,
        boundary_refresh_every=1,
        boundary_min_samples=4,
        flush_window_s=0.0,
        dynamic=False,
        b_max=100,
    )
    policy = SchedulingPolicy(config, ["w"])
    for i, predicted in enumerate([600, 700, 800, 900]):
        policy.submit(_request(i, predicted), 0.0)
    assert policy.snapshot()["queue_depth"] == [0, 4]
    assert policy.snapshot()["boundaries"] == [800]
    batch = policy.next_batch("w", 0.0)
    assert [r.request_id for r in batch.requests] == [0, 1, 2, 3]
    assert batch.bin_index == 1


def test_fifo_within_a_bin() -> None:
    config = PolicyConfig(
        num_bins=2, boundaries="fixed", max_len=100, dynamic=False, b_max=3, flush_window_s=0.0
    )
    policy = SchedulingPolicy(config, ["w"])
    order = [(0, 10), (1, 90), (2, 20), (3, 30), (4, 95), (5, 40), (6, 5)]
    for i, predicted in order:
        policy.submit(_request(i, predicted, arrival=float(i)), float(i))
    taken = []
    while (batch := policy.next_batch("w", 10.0)) is not None:
        taken.append((batch.bin_index, [r.request_id for r in batch.requests]))
        policy.on_batch_failed("w", batch, 10.0)
    assert taken == [(0, [0, 2, 3]), (1, [1, 4]), (0, [5, 6])]


def test_explicit_boundaries_must_match_the_bin_count() -> None:
    with pytest.raises(PolicyConfigError, match="num_bins - 1"):
        PolicyConfig(num_bins=3, boundaries=[10.0])
    with pytest.raises(PolicyConfigError, match="ascending"):
        PolicyConfig(num_bins=3, boundaries=[10.0, 5.0])
    assert PolicyConfig(num_bins=3, boundaries=[10, 50]).bin_boundaries().assign(50) == 2


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_bins", 0, "num_bins"),
        ("bin_selection", "shortest", "bin_selection"),
        ("boundaries", "quantile", "boundaries"),
        ("eps_mem", 0.7, "eps_mem"),
        ("b_min", 10, "b_min"),
        ("flush_window_s", -1.0, "flush_window_s"),
        ("d_sla_s", 0.0, "d_sla_s"),
    ],
)
def test_bad_configuration_fails_loudly(field: str, value: object, message: str) -> None:
    kwargs = {"b_max": 5} if field == "b_min" else {}
    with pytest.raises(PolicyConfigError, match=message):
        PolicyConfig(**{field: value, **kwargs})


def test_fixed_batch_size_needs_static_mode() -> None:
    with pytest.raises(PolicyConfigError, match="dynamic=False"):
        PolicyConfig(fixed_batch_size=8)
