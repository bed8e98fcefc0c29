"""bench_predict's history: each row simulated after what its set-up's server served before it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_policies import TimedRequest
from bench_predict import HISTORY_ID_STRIDE, history_phases, served_before, simulate

from specbatch.scheduling.admission import AdmissionConfig, AdmissionPolicy
from specbatch.scheduling.simulate.continuous import SimInstance, SimRequest, StepCosts


def row(setup: str, load: float, round_: int = 0, phase: str = "load") -> dict:
    return {"setup": setup, "load": load, "round": round_, "phase": phase}


def test_a_row_follows_its_own_set_ups_earlier_rounds_and_loads_and_the_overload_comes_last():
    first = row("least_slack", 1.0)
    second = row("least_slack", 1.5)
    overload = row("least_slack", 2.0, phase="overload")
    next_round = row("least_slack", 1.0, round_=1)
    other = row("fcfs", 1.0)
    other_workload = row("least_slack", 1.0)
    pairs = [
        ("memory", next_round),
        ("memory", overload),
        ("memory", second),
        ("memory", first),
        ("memory", other),
        ("infobench", other_workload),
    ]
    before = served_before(pairs)
    assert before[0] == [first, second, overload]
    assert before[1] == [first, second]
    assert before[2] == [first]
    assert before[3] == []
    assert before[4] == []  # fcfs served on a server of its own
    assert before[5] == []  # another workload's server


def test_earlier_phases_end_a_drain_before_the_next_begins_with_ids_past_the_rows_own():
    oldest = [TimedRequest(0.0, "a", 8), TimedRequest(4.0, "b", 8)]
    latest = [TimedRequest(1.0, "c", 8), TimedRequest(10.0, "d", 8)]
    placed = history_phases([oldest, latest], gap_s=100.0)
    assert [phase.arrivals for phase in placed] == [oldest, latest]
    # the latest's last arrival 100 s before the row's clock starts; the oldest's last
    # arrival 100 s before the latest's first
    assert latest[-1].at_s + placed[1].shift_s == pytest.approx(-100.0)
    assert oldest[-1].at_s + placed[0].shift_s == pytest.approx(latest[0].at_s + placed[1].shift_s - 100.0)
    assert {phase.first_id for phase in placed} == {HISTORY_ID_STRIDE, 2 * HISTORY_ID_STRIDE}
    assert history_phases([], gap_s=100.0) == []


def test_only_the_rows_own_requests_are_measured():
    args = argparse.Namespace(sla_ttft_s=2.0, sla_base_s=0.5, sla_per_token_s=0.01)
    own = [TimedRequest(0.1 * i, "own", 16) for i in range(3)]
    history = [SimRequest(HISTORY_ID_STRIDE + i, -200.0 + 0.1 * i, 32, 16, 16.0) for i in range(5)]
    requests = history + [SimRequest(i, a.at_s, 32, 16, 16.0) for i, a in enumerate(own)]
    costs = StepCosts(base_s=0.001, per_row_s=0.0005)
    policy = AdmissionPolicy(AdmissionConfig(order="fcfs", memory_aware=False, sla_aware=False))
    measured = simulate(policy, SimInstance(), costs, requests, own, args)
    assert measured["refused"] == 0
    span_s = own[-1].at_s + 16 * (0.001 + 0.0005 * 3)  # at most this long after the last arrival
    assert 3 / span_s <= measured["goodput_rps"] <= 3 / own[-1].at_s
