"""Irregular steps in the step simulator (``step_cv``): each step lasts its cost times a
seeded lognormal factor of mean 1, and the instance reports what it took."""

from __future__ import annotations

import statistics

import pytest

from specbatch.scheduling.admission import AdmissionConfig, AdmissionPolicy
from specbatch.scheduling.simulate.continuous import ContinuousSimulator, SimInstance, SimRequest, StepCosts

STEP_S = 0.01


def one_row_run(step_cv: float, seed: int = 0, tokens: int = 400) -> list[float]:
    """The done time of one row of ``tokens`` tokens alone on an instance, 10 ms a step."""
    config = AdmissionConfig(
        order="fcfs", max_rows=1, queue_limit=4, sla_aware=False, memory_aware=False, shed_deadlines=False
    )
    simulator = ContinuousSimulator(
        lambda: AdmissionPolicy(config),
        [SimInstance(max_rows=1)],
        StepCosts(base_s=STEP_S, per_row_s=0.0, per_prefill_token_s=0.0),
        step_cv=step_cv,
        seed=seed,
    )
    outcome = simulator.run([SimRequest(0, 0.0, 10, tokens, float(tokens))])[0]
    return [outcome.first_token_s, outcome.done_s]


def test_without_step_cv_every_step_costs_exactly_its_price():
    assert one_row_run(0.0) == pytest.approx([STEP_S, 400 * STEP_S])


def test_irregular_steps_keep_their_mean_and_spread_as_asked():
    first_steps = [one_row_run(0.3, seed, tokens=1)[1] for seed in range(400)]
    assert statistics.mean(first_steps) == pytest.approx(STEP_S, rel=0.05)
    assert statistics.stdev(first_steps) / STEP_S == pytest.approx(0.3, rel=0.15)
    assert one_row_run(0.3)[1] == pytest.approx(400 * STEP_S, rel=0.1)  # 400 steps average out


def test_the_same_seed_draws_the_same_steps_and_another_seed_others():
    assert one_row_run(0.3, seed=5) == one_row_run(0.3, seed=5)
    assert one_row_run(0.3, seed=5) != one_row_run(0.3, seed=6)


def test_a_negative_step_cv_is_refused():
    with pytest.raises(ValueError, match="step_cv"):
        ContinuousSimulator(lambda: AdmissionPolicy(AdmissionConfig()), step_cv=-0.1)
