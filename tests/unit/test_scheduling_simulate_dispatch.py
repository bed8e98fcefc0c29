"""The step simulator decides as the live scheduler does: a row sent to a stepping
instance joins at its next boundary, one decided on the instance's own report a step later."""

from __future__ import annotations

import pytest

from specbatch.scheduling.admission import AdmissionConfig, AdmissionPolicy
from specbatch.scheduling.simulate.continuous import ContinuousSimulator, SimInstance, SimRequest, StepCosts


def first_and_last_tokens(lagged_dispatch: bool) -> list[float]:
    """Three prompts at once on one instance of two rows, 10 ms a step, one token a step:
    a row of 6 tokens and two of 2, first come first served."""
    config = AdmissionConfig(
        order="fcfs", max_rows=2, queue_limit=16, sla_aware=False, memory_aware=False, shed_deadlines=False
    )
    simulator = ContinuousSimulator(
        lambda: AdmissionPolicy(config),
        [SimInstance(max_rows=2)],
        StepCosts(base_s=0.01, per_row_s=0.0, per_prefill_token_s=0.0),
        lagged_dispatch=lagged_dispatch,
    )
    requests = [SimRequest(i, 0.0, 10, n, float(n)) for i, n in enumerate((6, 2, 2))]
    return [time for o in simulator.run(requests) for time in (o.first_token_s, o.done_s)]


def test_a_row_started_in_the_place_of_one_that_ended_joins_a_step_later():
    # the first starts the idle instance at once; the second, sent while it steps, joins
    # the second step (ends at 30 ms); the third takes its row: decided on the report of
    # the step that ended it, it joins the step after the one the instance went on with
    assert first_and_last_tokens(lagged_dispatch=True) == pytest.approx([0.01, 0.06, 0.02, 0.03, 0.05, 0.06])


def test_without_the_lag_the_decision_comes_before_the_next_step():
    assert first_and_last_tokens(lagged_dispatch=False) == pytest.approx([0.01, 0.06, 0.02, 0.03, 0.04, 0.05])


def test_a_long_row_makes_every_step_beside_it_dearer_by_its_context():
    """1 ms a step plus 1 µs a context slot (rows x the longest context). A prompt of L
    tokens starts alone; a 10-token prompt arriving with it joins its second step (both
    rows at the long one's L + 1) and takes its second token alone (context 11)."""
    config = AdmissionConfig(
        order="fcfs", max_rows=2, queue_limit=4, sla_aware=False, memory_aware=False, shed_deadlines=False
    )
    costs = StepCosts(base_s=0.001, per_row_s=0.0, per_prefill_token_s=0.0, per_context_slot_s=1e-6)
    simulator = ContinuousSimulator(lambda: AdmissionPolicy(config), [SimInstance(max_rows=2)], costs)

    def short_done(long_prompt: int) -> float:
        requests = [SimRequest(0, 0.0, long_prompt, 2, 2.0), SimRequest(1, 0.0, 10, 2, 2.0)]
        return simulator.run(requests)[1].done_s

    for long_prompt in (10, 1000):
        slots = long_prompt + 2 * (long_prompt + 1) + 11
        assert short_done(long_prompt) == pytest.approx(3 * 0.001 + slots * 1e-6)
