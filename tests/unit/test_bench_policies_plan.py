"""The order bench_policies runs its cells in: one server at a time for one round;
interleaved, rotated rounds for several, each set-up at every load once a round; and
what a cell's row counts."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_policies import (
    ServedWorkload,
    Session,
    Setup,
    TimedRequest,
    Turn,
    by_length,
    capacity_table,
    chosen_setups,
    keeps_up,
    plan,
    reference_first,
    saturated,
    summarise,
    targets,
    targets_table,
)

C, A, B = (
    Setup(name, label, {})
    for name, label in [("triton_batching", "(c)"), ("least_slack", "(a)"), ("fcfs", "(b)")]
)


def cells(steps: list[Turn]) -> list[tuple[int, str, float | None]]:
    return [(step.round, step.setup.name, step.load) for step in steps]


def test_one_round_runs_each_set_up_through_its_loads_then_the_next():
    assert cells(plan([C, A, B], [0.8, 1.0], 1, overload=True)) == [
        (0, "triton_batching", 0.8),
        (0, "triton_batching", 1.0),
        (0, "least_slack", 0.8),
        (0, "least_slack", 1.0),
        (0, "least_slack", None),
        (0, "fcfs", 0.8),
        (0, "fcfs", 1.0),
    ]


def test_rounds_interleave_the_set_ups_at_each_load_in_a_rotated_order():
    steps = cells(plan([C, A, B], [0.8, 1.0], 3, overload=False))
    assert steps[:6] == [
        (0, "triton_batching", 0.8),
        (0, "least_slack", 0.8),
        (0, "fcfs", 0.8),
        (0, "triton_batching", 1.0),
        (0, "least_slack", 1.0),
        (0, "fcfs", 1.0),
    ], "the first round starts with the reference, whose capacity sets the rates"
    assert [name for r, name, load in steps if r == 1 and load == 0.8] == [
        "least_slack",
        "fcfs",
        "triton_batching",
    ]
    assert [name for r, name, load in steps if r == 2 and load == 0.8] == [
        "fcfs",
        "triton_batching",
        "least_slack",
    ]
    for r in range(3):
        for load in (0.8, 1.0):
            assert sorted(name for rr, name, ll in steps if (rr, ll) == (r, load)) == sorted(
                ["triton_batching", "least_slack", "fcfs"]
            )


def test_the_prompt_heavy_overload_runs_once_a_round_after_its_loads():
    steps = cells(plan([C, A, B], [1.0], 2, overload=True))
    assert [cell for cell in steps if cell[2] is None] == [(0, "least_slack", None), (1, "least_slack", None)]
    assert steps.index((0, "least_slack", None)) > steps.index((0, "fcfs", 1.0))


def test_an_ablation_of_a_chosen_with_it_runs_the_overload_too_in_the_rounds_order():
    late = Setup("late_twice", "(a) late rows steered to twice their budget", {})
    steps = cells(plan([A, B, late], [1.0], 2, overload=True))
    assert [cell for cell in steps if cell[2] is None] == [
        (0, "least_slack", None),
        (0, "late_twice", None),
        (1, "late_twice", None),
        (1, "least_slack", None),
    ], "in the order of the round, rotated as at the loads"
    without_a = cells(plan([B, late], [1.0], 2, overload=True))
    assert [cell for cell in without_a if cell[2] is None] == [], "its rate is twice (a)'s capacity"


def test_the_reference_runs_first_whichever_it_is():
    assert [s.name for s in reference_first([C, A, B], "least_slack")] == [
        "least_slack",
        "triton_batching",
        "fcfs",
    ]
    assert [s.name for s in reference_first([C, A, B], "triton_batching")] == [
        "triton_batching",
        "least_slack",
        "fcfs",
    ]
    steps = cells(plan(reference_first([C, A, B], "least_slack"), [0.8], 2, overload=False))
    assert steps[0] == (0, "least_slack", 0.8), "the reference's probe sets the first load's rate"


def test_targets_against_c_are_judged_only_where_the_loads_are_c_s():
    def row(setup: str, load: float, goodput: float) -> dict:
        return {"setup": setup, "load": load, "round": 0, "goodput_rps": goodput}

    rows = [
        row(name, load, 2.0 if name == "least_slack" else 1.0)
        for name in ("least_slack", "triton_batching", "fcfs", "shortest_first")
        for load in (1.0, 1.2)
    ]
    at_c = targets([{"name": "infobench", "reference": "triton_batching", "rows": rows}])
    at_a = targets([{"name": "infobench", "reference": "least_slack", "rows": rows}])
    assert [t["target"] for t in at_c].count("(a) goodput / best (c)") == 2
    assert "(a) goodput / best (c)" not in [t["target"] for t in at_a]
    assert {t["reference"] for t in at_a} == {"least_slack"}
    assert "1.2× (a)" in targets_table(at_a)


def test_an_ablation_named_with_only_runs_on_a_workload_that_runs_none_by_default():
    mixed = ServedWorkload("mixed", "", lambda rate, d, seed: [], (C, A, B), "least_slack")
    assert [s.name for s in chosen_setups(mixed, None)] == ["triton_batching", "least_slack", "fcfs"]
    named = chosen_setups(mixed, ["fcfs", "slack_pace"])
    assert [s.name for s in named] == ["triton_batching", "least_slack", "fcfs", "slack_pace"]
    assert named[-1].options["env"] == {"SPECBATCH_B_SLA_PACE": "slack"}


def test_each_class_of_max_tokens_counts_its_offered_refused_and_met_requests():
    arrivals = [TimedRequest(0.1 * i, "p", tokens) for i, tokens in enumerate([8, 32, 33, 192, 512, 16])]
    served = [{"id": i} for i in (0, 2, 3, 4)]  # 1 and 5 refused
    met = [{"id": i} for i in (0, 3)]
    assert by_length(arrivals, served, met) == {
        "<= 32 tokens": {"offered": 3, "refused": 2, "met": 1},
        "33-192 tokens": {"offered": 2, "refused": 0, "met": 1},
        "> 192 tokens": {"offered": 1, "refused": 0, "met": 0},
    }


def test_a_goodput_target_reports_the_most_its_cell_allows_and_is_still_judged_on_the_measure():
    """At a load where the peer met nearly every SLA, the ratio cannot reach the target:
    the table says so beside the miss, and the miss stands."""
    arrivals = [TimedRequest(0.25 * (i + 1), "p", 16) for i in range(40)]  # last arrival at 10 s
    args = argparse.Namespace(sla_ttft_s=2.0, sla_base_s=0.5, sla_per_token_s=0.01)

    def served(late: set[int]) -> list[dict]:
        return [
            {
                "id": i,
                "ttft_s": 0.1,
                "e2e_s": 1.0 if i in late else 0.5,
                "done_s": a.at_s + 0.5,
                "input_tokens": 10,
                "output_tokens": 16,
                "instance": "qwen3_specdec_0",
            }
            for i, a in enumerate(arrivals)
        ]

    mine = summarise(A, 4.0, arrivals, served(late=set()), args)
    theirs = summarise(B, 4.0, arrivals, served(late={0, 1}), args)
    assert mine["goodput_ceiling_rps"] == 40 / 10.0
    assert mine["goodput_rps"] <= mine["goodput_ceiling_rps"], (
        "every request met: the span passes the last arrival"
    )
    for row in (mine, theirs):
        row.update(load=1.2, round=0)
    [target] = targets([{"name": "infobench", "reference": "fcfs", "rows": [mine, theirs]}])
    assert math.isclose(target["ceiling"], 4.0 / theirs["goodput_rps"])
    assert target["ceiling"] < target["need"] and not target["met"]
    assert "short by" in targets_table([target]) and f"| {target['ceiling']:.2f} |" in targets_table([target])
    written_before = {k: v for k, v in mine.items() if k != "goodput_ceiling_rps"}
    [old] = targets([{"name": "infobench", "reference": "fcfs", "rows": [written_before, theirs]}])
    assert math.isnan(old["ceiling"]) and targets_table([old]).endswith("| — |")


def test_a_capacity_probe_is_saturated_by_a_backlog_or_refusals_where_completions_stop_rising():
    arrivals = [TimedRequest(0.1 * (i + 1), "p", 16) for i in range(100)]  # the probe's last at 10 s
    args = argparse.Namespace(capacity_probe_s=10.0, sla_base_s=0.5, sla_per_token_s=0.01)

    def probe(errors: int, span_s: float = 10.5, throughput_rps: float = 9.0) -> dict:
        return {"offered": 100, "errors": errors, "span_s": span_s, "throughput_rps": throughput_rps}

    assert not saturated(probe(errors=3), arrivals, args), "3 of 100 refused: a burst, it keeps up"
    assert not saturated(probe(errors=6), arrivals, args), "a first probe that refuses: the next decides"
    at_half_rate = probe(errors=6, throughput_rps=9.0)
    assert not saturated(probe(errors=12, throughput_rps=17.0), arrivals, args, at_half_rate), (
        "refusing 12 % at twice the rate, it completed 1.9x as many: still rising"
    )
    assert saturated(probe(errors=40, throughput_rps=11.0), arrivals, args, at_half_rate)
    assert not saturated(probe(errors=0, throughput_rps=9.5), arrivals, args, at_half_rate), (
        "refusing none, a flat probe keeps up (a backlog would show saturation)"
    )
    assert saturated(probe(errors=0, span_s=16.0), arrivals, args), "6 s to drain: past half the probe"
    assert not saturated(probe(errors=0, span_s=14.9), arrivals, args)


def test_a_probe_keeps_up_while_its_last_arrivals_are_no_later_than_its_first():
    """Lateness (end to end over SLA) of the last third of arrivals against the first:
    a queue growing over the probe fails it, as do a backlog past the longest SLA and
    refusing more than a burst."""
    arrivals = [TimedRequest(0.1 * (i + 1), "p", 50) for i in range(90)]  # SLA 1.0 s each
    args = argparse.Namespace(sla_ttft_s=2.0, sla_base_s=0.5, sla_per_token_s=0.01)

    def row(e2e_of: Callable[[float], float], refused: int = 0) -> dict:
        served = [
            {
                "id": i,
                "ttft_s": 0.1,
                "e2e_s": e2e_of(a.at_s),
                "done_s": a.at_s + e2e_of(a.at_s),
                "input_tokens": 10,
                "output_tokens": 50,
                "instance": "qwen3_specdec_0",
            }
            for i, a in enumerate(arrivals[refused:], refused)
        ]
        errors = [{"id": None, "error": "refused", "error_s": a.at_s} for a in arrivals[:refused]]
        return summarise(A, 9.0, arrivals, errors + served, args)

    steady = row(lambda at: 0.4 + 0.05 * (int(at * 10) % 3))
    assert steady["lateness_first_third"] == 0.45 and steady["lateness_last_third"] == 0.45
    assert keeps_up(steady, arrivals, args)
    assert keeps_up(row(lambda at: 0.4 if at < 3 else 0.7), arrivals, args), "0.7 <= 1.5 x 0.4 + 0.1"
    growing = row(lambda at: 0.4 + 0.2 * at)  # a backlog of 0.2 s per second of arrivals
    assert growing["lateness_last_third"] > 1.5 * growing["lateness_first_third"] + 0.1
    assert not keeps_up(growing, arrivals, args)
    behind_from_the_start = row(lambda at: 1.2)  # every answer 1.2 s: the last ends past its 1.0 s SLA
    assert behind_from_the_start["lateness_last_third"] == behind_from_the_start["lateness_first_third"]
    assert not keeps_up(behind_from_the_start, arrivals, args)
    assert keeps_up(row(lambda at: 0.4, refused=4), arrivals, args), "4 of 90 refused: a burst"
    assert not keeps_up(row(lambda at: 0.4, refused=5), arrivals, args), "5 of 90: more than 5 %"


class ModelledServer(Session):
    """A set-up whose probes are answered by a model of the rate: ``overload_rps`` when
    a probe saturates it, and kept up with below ``sustains_rps``."""

    def __init__(self, overload_rps: float, sustains_rps: float) -> None:
        self.args = argparse.Namespace(
            capacity_probe_s=10.0, probe_doublings=2, seed=0, sla_base_s=0.5, sla_per_token_s=0.01
        )
        self.overload_rps, self.sustains_rps, self.offered = overload_rps, sustains_rps, []

    def run(self, phase: str, rate: float, arrivals: list, load: float | None = None) -> dict:
        self.offered.append((phase, round(rate, 3)))
        kept = rate <= self.sustains_rps
        completed = rate if kept else self.overload_rps
        return {
            "rate": rate,
            "offered": len(arrivals),
            "completed": len(arrivals),
            "errors": 0,
            "span_s": arrivals[-1].at_s + (0.5 if kept else len(arrivals) / completed - arrivals[-1].at_s),
            "throughput_rps": completed,
            "lateness_first_third": 0.4,
            "lateness_last_third": 0.5 if kept else 2.0,
        }


def test_capacity_is_the_highest_rate_kept_up_with_not_the_completions_under_overload():
    """A static batcher completes 5 req/s under a 10 req/s probe but keeps up with 7:
    the search from 5 keeps up at 5 and 6.25, not at 7.81, so its capacity is 6.25."""
    workload = ServedWorkload(
        "w",
        "w",
        lambda rate, d, seed: [TimedRequest(i / rate, "p", 16) for i in range(int(rate * d))],
        (),
        "triton_batching",
    )
    batcher = ModelledServer(overload_rps=5.0, sustains_rps=7.0)
    probe = batcher.capacity(workload, 10.0)
    assert batcher.offered == [
        ("capacity", 10.0),
        ("sustained", 5.0),
        ("sustained", 6.25),
        ("sustained", 7.812),
    ]
    assert probe["throughput_rps"] == 5.0 and probe["capacity_rps"] == 6.25
    assert [p["kept_up"] for p in probe["sustained"]] == [True, True, False]
    [row] = capacity_table({"capacities": {"c": probe | {"label": "(c)"}}}).splitlines()[2:]
    assert row.startswith("| (c) | 6.25 | 10.00 | 100/100 | 0 | 5.00 | yes | 5.00 (0.5, 0.50/0.40, yes), ")
    assert row.endswith(", 7.81 (5.7, 2.00/0.40, no) |"), "78 requests at 5 a second: the last at 9.9 s"

    saturates_below = ModelledServer(overload_rps=5.0, sustains_rps=4.0)
    probe = saturates_below.capacity(workload, 10.0)
    assert probe["capacity_rps"] == 5.0, "not kept up with at its own completions: those stand"
    assert saturates_below.offered == [("capacity", 10.0), ("sustained", 5.0)]

    never_saturated = ModelledServer(overload_rps=50.0, sustains_rps=100.0)
    probe = never_saturated.capacity(workload, 10.0)
    assert probe["capacity_rps"] == 40.0 and not probe["saturated"] and probe["sustained"] == []
