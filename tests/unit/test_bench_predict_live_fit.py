"""The step costs bench_predict reads from the live instances' counters: a fit over the
run's rows, then each row priced at its own tokens per row-step and machine speed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_predict import has_engine_figures, live_fit, machine_speed

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
    assert fit.rows == len(ROWS)


def test_a_row_is_priced_at_its_own_tokens_per_row_step_and_speed() -> None:
    fit = live_fit(ROWS)
    slow = served_row(1000, 4.0, 1.75, 5000, slower=1.6)
    costs = fit.costs(slow)
    assert costs.tokens(1) == costs.tokens(40) == pytest.approx(1.75)
    # the committed tokens' price is carried per row-step at this row's tokens per row-step
    assert costs.per_row_s == pytest.approx(PER_ROW + PER_TOKEN * 1.75)
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
