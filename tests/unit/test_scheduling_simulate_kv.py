"""KV blocks in the step simulator: rows wait until they fit, and where running rows
outgrow the blocks the newest is preempted and prefills its context again on return,
as the engine does."""

from __future__ import annotations

import pytest

from specbatch.scheduling.admission import AdmissionConfig, AdmissionPolicy
from specbatch.scheduling.simulate.continuous import ContinuousSimulator, SimInstance, SimRequest, StepCosts

STEP_S = 0.01
PREFILL_TOKEN_S = 0.001


def first_come(instance: SimInstance) -> ContinuousSimulator:
    """First-come batching that sends every row it may, blind to KV (set-up (b))."""
    config = AdmissionConfig(
        order="fcfs", max_rows=4, queue_limit=16, sla_aware=False, memory_aware=False, shed_deadlines=False
    )
    costs = StepCosts(base_s=STEP_S, per_row_s=0.0, per_prefill_token_s=PREFILL_TOKEN_S)
    return ContinuousSimulator(lambda: AdmissionPolicy(config), [instance], costs)


def test_the_newest_row_is_preempted_when_the_running_rows_outgrow_the_blocks() -> None:
    # five blocks of 16 tokens, 16-token prompts: the second row joins at the first
    # step's end (the instance was stepping when it arrived) and fits beside the first
    # until the first holds 33 tokens and itself 32 (three blocks each, after 17 and 16
    # tokens); it then waits for the first to end, and prefills its prompt and its 16
    # tokens again
    simulator = first_come(SimInstance(kv_tokens=80, block_size=16, max_rows=4))
    first, second = simulator.run([SimRequest(0, 0.0, 16, 30, 30.0), SimRequest(1, 0.0, 16, 30, 30.0)])
    assert first.preemptions == 0 and second.preemptions == 1
    prompts = 2 * 16 * PREFILL_TOKEN_S  # the first's prompt in the first step, the second's in the next
    assert first.done_s == pytest.approx(30 * STEP_S + prompts)
    assert second.first_token_s == pytest.approx(2 * STEP_S + prompts)
    # readmitted as the first ends: 32 tokens prefilled again, then its last 14 tokens
    assert second.done_s == pytest.approx(first.done_s + 14 * STEP_S + 32 * PREFILL_TOKEN_S)


def test_a_row_waits_until_its_blocks_fit_beside_the_running_ones() -> None:
    # four blocks: beside the first row (two blocks) the second needs two and the
    # reserve one more, so it starts only when the first ends
    simulator = first_come(SimInstance(kv_tokens=64, block_size=16, max_rows=4))
    first, second = simulator.run([SimRequest(0, 0.0, 16, 30, 30.0), SimRequest(1, 0.0, 16, 30, 30.0)])
    assert (first.preemptions, second.preemptions) == (0, 0)
    assert first.done_s == pytest.approx(30 * STEP_S + 16 * PREFILL_TOKEN_S)
    assert second.first_token_s == pytest.approx(first.done_s + STEP_S + 16 * PREFILL_TOKEN_S)


def test_rows_that_fit_beside_each_other_are_never_preempted() -> None:
    simulator = first_come(SimInstance(kv_tokens=16384, block_size=16, max_rows=4))
    outcomes = simulator.run([SimRequest(i, 0.0, 16, 30, 30.0) for i in range(2)])
    assert [o.preemptions for o in outcomes] == [0, 0]
    prompts = 2 * 16 * PREFILL_TOKEN_S
    assert [o.done_s for o in outcomes] == pytest.approx([30 * STEP_S + prompts, 31 * STEP_S + prompts])


def test_a_row_larger_than_the_blocks_runs_alone_rather_than_wait_for_ever() -> None:
    simulator = first_come(SimInstance(kv_tokens=32, block_size=16, max_rows=4))
    [outcome] = simulator.run([SimRequest(0, 0.0, 64, 4, 4.0)])
    assert outcome.status == "served" and outcome.preemptions == 0
