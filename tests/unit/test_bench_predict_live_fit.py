"""The step costs bench_predict reads from the live instances' counters: a fit over the
run's rows, then each row priced at its own tokens per row-step and machine speed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_predict import (
    has_engine_figures,
    live_fit,
    machine_speed,
    measured_step_cv,
    step_cv_choice,
    step_shape,
)

BASE, PER_ROW, PER_TOKEN, PER_PREFILL = 0.010, 0.002, 0.004, 0.0002


def served_row(steps: int, rows: float, tokens: float, prefilled: int, slower: float = 1.0) -> dict:
    """A bench_policies row whose instances' steps cost exactly the model above, ``slower``
    times over."""
    row_steps = round(steps * rows)
    row_tokens = round(row_steps * tokens)
    seconds = slower * (BASE * steps + PER_ROW * row_steps + PER_TOKEN * row_tokens + PER_PREFILL * prefilled)
    return {
        "engine": {"steps": steps, "row_steps": row_steps, "row_tokens": row_tokens, "step_seconds": seconds},
        "prefilled_tokens": prefilled,
    }


ROWS = [
    served_row(900, 2.3, 1.85, 4300),
    served_row(1100, 3.2, 1.26, 4900),
    served_row(800, 5.5, 1.39, 6600),
    served_row(1500, 1.1, 1.50, 2900),
    served_row(1200, 1.9, 1.10, 2100),
    served_row(1000, 3.6, 1.62, 3100),
]


def test_the_fit_recovers_the_costs_the_counters_came_from() -> None:
    fit = live_fit(ROWS)
    assert (fit.base_s, fit.per_row_s, fit.per_token_s, fit.per_prefill_token_s) == pytest.approx(
        (BASE, PER_ROW, PER_TOKEN, PER_PREFILL), rel=1e-6
    )
    assert fit.rows == fit.buckets == len(ROWS)


def test_a_row_is_priced_at_its_own_tokens_per_row_step_and_speed() -> None:
    fit = live_fit(ROWS)
    slow = served_row(1000, 4.0, 1.75, 5000, slower=1.6)
    costs = fit.costs(slow)
    assert costs.tokens(1) == costs.tokens(40) == pytest.approx(1.75)
    # a step's rows pay for the tokens they commit, at this row's tokens per row-step
    assert costs.step_s(4, 0) == pytest.approx(BASE + 4 * (PER_ROW + PER_TOKEN * 1.75))
    assert machine_speed(costs, slow) == pytest.approx(1.6)
    assert machine_speed(fit.costs(ROWS[0]), ROWS[0]) == pytest.approx(1.0)


def test_rows_without_engine_figures_are_left_out() -> None:
    idle = {
        "engine": {"steps": 0, "row_steps": 0, "row_tokens": 0, "step_seconds": 0.0},
        "prefilled_tokens": 0,
    }
    assert not has_engine_figures(idle) and not has_engine_figures({"prefilled_tokens": 0})
    assert machine_speed(live_fit(ROWS).costs(ROWS[1]), idle) is None
    assert live_fit([*ROWS, idle, {"prefilled_tokens": 0}]).rows == len(ROWS)


def bucket(steps: int, rows: float, tokens: float, prefilled: int) -> dict:
    """One batch-size bucket's counters of steps that cost exactly the model above."""
    row_steps = round(steps * rows)
    committed = round(row_steps * tokens)
    seconds = BASE * steps + PER_ROW * row_steps + PER_TOKEN * committed + PER_PREFILL * prefilled
    return {
        "steps": steps,
        "row_steps": row_steps,
        "tokens": committed,
        "prefill_tokens": prefilled,
        "seconds": seconds,
    }


def by_batch_row(buckets: dict[str, dict], slower: float = 1.0) -> dict:
    """A bench_policies row with the per-batch counters, its totals their sums."""
    buckets = {rows: {**b, "seconds": b["seconds"] * slower} for rows, b in buckets.items()}
    engine = {
        "steps": sum(b["steps"] for b in buckets.values()),
        "row_steps": sum(b["row_steps"] for b in buckets.values()),
        "row_tokens": sum(b["tokens"] for b in buckets.values()),
        "step_seconds": sum(b["seconds"] for b in buckets.values()),
        "by_batch": buckets,
    }
    # the prefix counters count prefill outside committing steps too: not what the fit reads
    return {"engine": engine, "prefilled_tokens": 10 * sum(b["prefill_tokens"] for b in buckets.values())}


def test_per_batch_counters_give_the_fit_and_each_batch_size_its_own_tokens() -> None:
    # speculation pays at small batches and switches itself off at large ones
    rows = [
        by_batch_row(
            {"1": bucket(300, 1, 2.6, 900), "4": bucket(200, 3.5, 1.8, 400), "16": bucket(90, 12, 1.0, 50)}
        ),
        by_batch_row({"2": bucket(250, 2, 2.2, 700), "8": bucket(150, 6.5, 1.3, 300)}),
        by_batch_row({"1": bucket(100, 1, 2.5, 200), "32": bucket(60, 24, 1.0, 0)}),
    ]
    fit = live_fit(rows)
    assert (fit.rows, fit.buckets) == (3, 7)
    assert (fit.base_s, fit.per_row_s, fit.per_token_s, fit.per_prefill_token_s) == pytest.approx(
        (BASE, PER_ROW, PER_TOKEN, PER_PREFILL), rel=1e-3
    )
    costs = fit.costs(rows[0])
    assert costs.tokens(1) == pytest.approx(2.6, rel=1e-2) and costs.tokens(12) == pytest.approx(
        1.0, rel=1e-2
    )
    assert costs.step_s(12, 0) == pytest.approx(BASE + 12 * (PER_ROW + PER_TOKEN * costs.tokens(12)))
    assert machine_speed(costs, rows[0]) == pytest.approx(1.0, rel=1e-3)
    slow = by_batch_row({"1": bucket(100, 1, 2.5, 200), "32": bucket(60, 24, 1.0, 0)}, slower=1.3)
    assert machine_speed(fit.costs(slow), slow) == pytest.approx(1.3, rel=1e-3)


def test_the_step_shape_sums_each_batch_size_over_rows_at_one_machine_speed() -> None:
    rows = [
        by_batch_row({"1": bucket(300, 1, 2.6, 900), "4": bucket(200, 3.5, 1.8, 400)}),
        by_batch_row({"1": bucket(100, 1, 2.2, 100), "16": bucket(90, 12, 1.0, 50)}),
        by_batch_row({"2": bucket(250, 2, 2.2, 700), "16": bucket(150, 14, 1.0, 0)}),
    ]
    fit = live_fit(rows)
    slow = by_batch_row({"1": bucket(100, 1, 2.2, 100), "16": bucket(90, 12, 1.0, 50)}, slower=2.0)
    shape = step_shape([*rows, slow, {"prefilled_tokens": 0}], fit)
    assert [b["rows_up_to"] for b in shape] == ["1", "2", "4", "16"]
    assert [b["steps"] for b in shape] == [500, 250, 200, 330]
    assert shape[0]["tokens_per_row_step"] == pytest.approx((780 + 220 + 220) / 500, rel=1e-3)
    assert shape[3]["mean_rows"] == pytest.approx((1080 + 2100 + 1080) / 330)
    # the slow row's seconds are brought to the fit's speed: the shape is exact
    for b in shape:
        assert b["measured_step_s"] == pytest.approx(b["fitted_step_s"], rel=1e-3)


def test_a_rows_step_spread_is_read_from_its_decode_steps_and_is_zero_where_it_was_not_counted() -> None:
    spread = {"decode_steps": 40.0, "decode_seconds": 0.4, "decode_seconds_squared": 0.4 * 0.01 * 1.09}
    row = {"engine": {"by_batch": {"4": {"steps": 50.0, "seconds": 0.6, **spread}}}}
    assert measured_step_cv(row) == pytest.approx(0.3)
    before_the_counters = {"engine": {"by_batch": {"4": {"steps": 50.0, "seconds": 0.6}}}}
    assert measured_step_cv(before_the_counters) == 0.0
    assert measured_step_cv({"engine": {"steps": 5}}) == 0.0


def test_step_cv_is_a_number_or_each_rows_measured_spread() -> None:
    assert step_cv_choice("0.3") == 0.3 and step_cv_choice("measured") is None
    with pytest.raises(argparse.ArgumentTypeError):
        step_cv_choice("-0.1")
