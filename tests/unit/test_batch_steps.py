"""An engine's steps counted per batch-size bucket."""

from __future__ import annotations

import pytest

from specbatch.scheduling.load import (
    STEP_BATCH_BOUNDS,
    STEP_BATCH_LABELS,
    BatchStepCounter,
    BatchStepTotals,
    decode_step_cv,
    step_batch_bucket,
)


@pytest.mark.parametrize(
    ("rows", "label"), [(0, "1"), (1, "1"), (2, "2"), (3, "4"), (4, "4"), (5, "8"), (64, "64"), (65, "+Inf")]
)
def test_a_step_counts_in_the_bucket_whose_bound_first_holds_its_rows(rows, label):
    assert STEP_BATCH_LABELS[step_batch_bucket(rows)] == label


def test_every_bucket_holds_the_batches_up_to_its_bound_and_above_the_one_before():
    for lower, upper in zip((0, *STEP_BATCH_BOUNDS), STEP_BATCH_BOUNDS, strict=False):
        assert {step_batch_bucket(rows) for rows in range(lower + 1, upper + 1)} == {
            STEP_BATCH_BOUNDS.index(upper)
        }


def test_the_counter_totals_steps_rows_tokens_prefill_and_seconds_per_bucket():
    counter = BatchStepCounter()
    counter.record(rows=3, tokens=7, prefill_tokens=64, seconds=0.5, context_slots=3 * 90)
    counter.record(rows=4, tokens=4, prefill_tokens=0, seconds=0.25, context_slots=4 * 20)
    counter.record(rows=1, tokens=3, prefill_tokens=5, seconds=0.125)
    totals = counter.totals()
    empty = (0,) * (len(STEP_BATCH_LABELS) - 3)
    assert totals.steps == (1, 0, 2, *empty)
    assert totals.row_steps == (1, 0, 7, *empty)
    assert totals.tokens == (3, 0, 11, *empty)
    assert totals.prefill_tokens == (5, 0, 64, *empty)
    assert totals.seconds == (0.125, 0.0, 0.75, *empty)
    # the step that prefilled nothing counts apart too, with its squared seconds
    assert totals.decode_steps == (0, 0, 1, *empty)
    assert totals.decode_seconds == (0.0, 0.0, 0.25, *empty)
    assert totals.decode_seconds_squared == (0.0, 0.0, 0.0625, *empty)
    # the rows of each step times its longest context: what its attention read
    assert totals.context_slots == (0, 0, 350, *empty)


def test_the_spread_of_a_steps_time_is_read_per_batch_size_without_prefills_and_weighted_by_steps():
    counter = BatchStepCounter()
    for seconds in (0.008, 0.012) * 10:  # one row: mean 10 ms, standard deviation 2 ms
        counter.record(rows=1, tokens=1, prefill_tokens=0, seconds=seconds)
    for seconds in (0.015, 0.025) * 30:  # eight rows: mean 20 ms, standard deviation 5 ms
        counter.record(rows=8, tokens=8, prefill_tokens=0, seconds=seconds)
    counter.record(rows=8, tokens=8, prefill_tokens=500, seconds=1.0)  # a prefill: not in the spread
    counter.record(rows=2, tokens=2, prefill_tokens=0, seconds=0.5)  # one step: too few to read
    totals = counter.totals()
    cv = decode_step_cv(totals.decode_steps, totals.decode_seconds, totals.decode_seconds_squared)
    assert cv == pytest.approx((20 * 0.2 + 60 * 0.25) / 80)
    # the same steps counted twice (two instances alike) read the same spread
    doubled = [tuple(2 * v for v in values) for values in (totals.decode_steps, totals.decode_seconds)]
    assert decode_step_cv(*doubled, tuple(2 * v for v in totals.decode_seconds_squared)) == pytest.approx(cv)
    assert decode_step_cv((3,), (0.03,), (0.0003,)) is None


def steps_costing(base_s: float, per_row_s: float, batches: dict[int, int]) -> BatchStepTotals:
    """Counters of steps that cost ``base_s`` plus ``per_row_s`` a row, and 2 ms for each
    of 100 prompt tokens prefilled in the first step of every batch size: ``batches``
    maps rows to steps taken at that size."""
    counter = BatchStepCounter()
    for rows, steps in batches.items():
        for step in range(steps):
            prefill = 100 if step == 0 else 0
            counter.record(rows, 2 * rows, prefill, base_s + per_row_s * rows + 0.002 * prefill)
    return counter.totals()


def test_what_one_more_row_adds_to_a_step_is_the_slope_of_step_seconds_on_rows_less_prefill():
    totals = steps_costing(0.003, 0.001, {1: 40, 3: 20, 8: 10, 24: 5})
    assert totals.row_step_s(prefill_s_per_token=0.002) == pytest.approx(0.001)
    assert totals.tokens_per_row_step == pytest.approx(2.0)


def test_the_counters_say_nothing_of_a_rows_cost_until_two_batch_sizes_ran_and_cost_grows():
    assert BatchStepTotals().row_step_s(0.0) is None
    assert BatchStepTotals().tokens_per_row_step == 1.0
    assert steps_costing(0.003, 0.001, {4: 30}).row_step_s(0.002) is None
    assert steps_costing(0.005, -0.0001, {1: 30, 8: 30}).row_step_s(0.002) is None


def test_a_rows_cost_is_never_more_than_a_row_steps_mean_share():
    # steps that grow faster than their rows (no fixed cost, or a negative one by the fit)
    counter = BatchStepCounter()
    counter.record(1, 1, 0, 0.001)
    counter.record(8, 8, 0, 0.030)
    assert counter.totals().row_step_s(0.0) == pytest.approx(0.031 / 9)


def test_the_mean_step_of_a_batch_size_is_that_buckets_seconds_over_its_steps():
    counter = BatchStepCounter()
    for rows, seconds in ((1, 0.004), (1, 0.006), (3, 0.009), (4, 0.011)):
        counter.record(rows, rows, 0, seconds)
    totals = counter.totals()
    assert totals.mean_step_s(1) == pytest.approx(0.005)
    assert totals.mean_step_s(4) == pytest.approx(0.010), "3 and 4 rows count in one bucket"
    assert totals.mean_step_s(8) is None, "no step of that size ran"
    assert BatchStepTotals().mean_step_s(1) is None
