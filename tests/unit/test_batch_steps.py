"""An engine's steps counted per batch-size bucket."""

from __future__ import annotations

import pytest

from specbatch.decoding.batch_steps import BatchStepCounter
from specbatch.scheduling.load import STEP_BATCH_BOUNDS, STEP_BATCH_LABELS, step_batch_bucket


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
    counter.record(rows=3, tokens=7, prefill_tokens=64, seconds=0.5)
    counter.record(rows=4, tokens=4, prefill_tokens=0, seconds=0.25)
    counter.record(rows=1, tokens=3, prefill_tokens=5, seconds=0.125)
    totals = counter.totals()
    empty = (0,) * (len(STEP_BATCH_LABELS) - 3)
    assert totals.steps == (1, 0, 2, *empty)
    assert totals.row_steps == (1, 0, 7, *empty)
    assert totals.tokens == (3, 0, 11, *empty)
    assert totals.prefill_tokens == (5, 0, 64, *empty)
    assert totals.seconds == (0.125, 0.0, 0.75, *empty)
