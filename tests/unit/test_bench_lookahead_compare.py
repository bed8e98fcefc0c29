"""bench_lookahead with --compare: goodput judged against the named settings only, and
the tables name only what ran."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_lookahead import cell_summary, policy_table, running_in, verdicts

RATES = {  # tokens/s over three rounds
    "target_only": (100.0, 110.0, 90.0),
    "fixed_0": (101.0, 108.0, 92.0),
    "fixed_3": (120.0, 126.0, 110.0),
    "fixed_5": (130.0, 140.0, 118.0),
    "goodput": (125.0, 133.0, 112.0),
}


def _rows() -> list[dict]:
    return [
        {"pair": "a90", "concurrency": 16, "round": i, "policy": policy, "tokens_per_s": rate, "mean_k": 4.0}
        for policy, rates in RATES.items()
        for i, rate in enumerate(rates)
    ]


def _median_ratio(policy: str, of: str) -> float:
    return sorted(p / o for p, o in zip(RATES[policy], RATES[of], strict=True))[1]


def test_goodput_is_judged_against_the_settings_that_ran() -> None:
    cell = cell_summary(_rows(), "a90", 16)
    assert set(cell["medians"]) == set(RATES)
    assert cell["best_other"] == "fixed_5"
    assert cell["held_out_best"] == ["fixed_5"] * 3
    assert cell["goodput_vs_best"] == _median_ratio("goodput", "fixed_5")
    assert cell["control_vs_target_only"] == _median_ratio("fixed_0", "target_only")


def test_the_policy_table_has_a_column_per_setting_that_ran() -> None:
    header = policy_table([cell_summary(_rows(), "a90", 16)]).splitlines()[0]
    assert header == "| pair | c | K=0 | K=3 | K=5 | goodput |"


def test_the_verdicts_name_what_best_was_taken_over() -> None:
    lines = verdicts([cell_summary(_rows(), "a90", 16)], ("fixed_3", "fixed_5"))
    assert lines[1].startswith("goodput >= 0.97x the best of fixed_3, fixed_5 everywhere: worst ")
    assert "fixed K or rule" not in "\n".join(lines)


def test_the_untimed_round_runs_the_learners_that_ran() -> None:
    engines = {policy: object() for policy in ("target_only", "fixed_0", "fixed_4", "goodput")}
    assert list(running_in(engines, -1)) == ["goodput"]
    assert running_in(engines, 0) == engines
