"""bench_slow_machine simulates at the step costs bench_predict read from the live instances."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_slow_machine import live_step_costs

LIVE = {"base_s": 0.01, "per_row_s": 0.002, "per_token_s": 0.004, "per_prefill_token_s": 0.0002}
SHAPE = [
    {"rows_up_to": "1", "mean_rows": 1.0, "tokens_per_row_step": 2.5},
    {"rows_up_to": "16", "mean_rows": 12.0, "tokens_per_row_step": 1.0},
]


def test_each_batch_size_runs_at_the_tokens_the_live_rows_committed_there():
    costs = live_step_costs({"live_costs": LIVE, "step_shape": SHAPE})
    assert (costs.tokens(1), costs.tokens(12), costs.tokens(40)) == (2.5, 1.0, 1.0)
    assert costs.step_s(1, 100) == pytest.approx(0.01 + 0.002 + 0.004 * 2.5 + 0.0002 * 100)


def test_a_prediction_without_per_batch_figures_is_refused_with_what_to_run():
    with pytest.raises(SystemExit, match="per-batch step figures"):
        live_step_costs({"live_costs": LIVE, "costs": {}})


def test_the_table_shows_a_ratio_only_where_both_of_its_set_ups_ran():
    from bench_slow_machine import table

    def row(setup, goodput):
        return {
            "workload": "infobench",
            "speed": 1.0,
            "rate": 10.0,
            "setup": setup,
            "goodput_rps": goodput,
            "refused": 0.0,
            "e2e_over_sla_p99": 1.0,
        }

    setups = ["least_slack", "allowance_in_reach"]
    text = table([row("least_slack", 10.0), row("allowance_in_reach", 8.0)], setups)
    header, _, line = text.splitlines()
    assert header.endswith("| default / allowance in reach |") and "slack pace / fixed" not in header
    assert line.endswith("| 1.25 |")
