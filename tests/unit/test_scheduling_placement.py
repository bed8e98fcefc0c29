"""Length-affine placement: equal-work ranges of predicted lengths, one per instance, and
the admission that starts a prompt on its range's instance unless that one cannot."""

from __future__ import annotations

import pytest

from specbatch.scheduling import QueuedRequest
from specbatch.scheduling.admission import AdmissionConfig, AdmissionPolicy
from specbatch.scheduling.bins import equal_work_cuts
from specbatch.scheduling.errors import PolicyConfigError
from specbatch.scheduling.load import InstanceLoad
from specbatch.scheduling.placement import LengthAffinity
from specbatch.scheduling.simulate.continuous import ContinuousSimulator, SimInstance, SimRequest, StepCosts

ROOMY = InstanceLoad(blocks_total=1000, blocks_free=1000, block_size=16, max_rows=64)
# a heavy-tailed mix: nine short prompts for every long one
MIX = [20.0] * 9 + [500.0]


def test_equal_work_ranges_hold_equal_shares_of_the_summed_lengths():
    assert equal_work_cuts(list(range(1, 101)), 2) == [72]  # 1..71 sum to 2,556 of 5,050
    assert equal_work_cuts(list(range(1, 101)), 4) == [51, 72, 88]


def test_a_few_long_prompts_sharing_a_prediction_form_the_top_range_alone():
    # equal counts would cut among the short ones; equal work puts the long ones apart,
    # and a cut is the lowest value of the range above it
    assert equal_work_cuts(MIX * 10, 2) == [500.0]
    assert equal_work_cuts([5.0], 3) == [5.0, 5.0]
    with pytest.raises(ValueError):
        equal_work_cuts([], 2)


def test_a_prompt_has_a_home_only_among_several_instances_once_enough_lengths_are_seen():
    affinity = LengthAffinity(min_samples=20, refresh_every=10)
    for value in MIX:
        affinity.observe(value)
    assert affinity.home(500.0, ["a", "b"]) is None, "too few predictions seen"
    for value in MIX:
        affinity.observe(value)
    assert affinity.home(500.0, ["a"]) is None, "one instance: nothing to choose"
    assert affinity.home(20.0, ["b", "a"]) == "a"
    assert affinity.home(500.0, ["b", "a"]) == "b"
    assert affinity.home(800.0, ["b", "a"]) == "b"


def affine(max_rows: int = 8) -> AdmissionPolicy:
    admission = AdmissionPolicy(
        AdmissionConfig(
            placement="length_affine", sla_aware=False, max_rows=max_rows, queue_limit=1000, ttft_sla_s=60.0
        )
    )
    admission.add_instance("a", ROOMY)
    admission.add_instance("b", ROOMY)
    for index, predicted in enumerate(MIX * 5):  # 50 predictions seen: the ranges are set
        admission.enqueue(QueuedRequest(f"seen{index}", predicted, 10, 0.0))
        admission.cancel(f"seen{index}")
    return admission


def started_on(admission: AdmissionPolicy, now_s: float) -> dict[str, str]:
    return {r.request_id: name for name, rows in admission.admit_spread(now_s).items() for r in rows}


def test_short_and_long_prompts_start_on_their_own_instances_whatever_the_load():
    admission = affine()
    for index in range(4):
        admission.enqueue(QueuedRequest(f"short{index}", 20, 10, 0.0))
    admission.enqueue(QueuedRequest("long", 500, 10, 0.0))
    placed = started_on(admission, 0.0)
    # by load alone the five would alternate between a and b
    assert placed == {"short0": "a", "short1": "a", "short2": "a", "short3": "a", "long": "b"}


def test_a_prompt_spills_over_when_its_home_cannot_start_it():
    admission = affine(max_rows=2)
    for index in range(3):
        admission.enqueue(QueuedRequest(f"short{index}", 20, 10, 0.0))
    placed = started_on(admission, 0.0)
    assert placed == {"short0": "a", "short1": "a", "short2": "b"}, "a runs its two rows: b takes the third"
    admission.enqueue(QueuedRequest("long", 500, 10, 0.1))
    assert started_on(admission, 0.1) == {"long": "b"}


def test_an_unknown_placement_is_a_configuration_error():
    with pytest.raises(PolicyConfigError, match="placement"):
        AdmissionConfig(placement="nearest")


def test_under_the_simulators_clock_long_rows_run_apart_and_every_request_is_answered():
    config = AdmissionConfig(placement="length_affine", queue_limit=1000, max_rows=16, ttft_sla_s=5.0)
    costs = StepCosts(base_s=0.01, per_row_s=0.001)
    simulator = ContinuousSimulator(lambda: AdmissionPolicy(config), [SimInstance(max_rows=16)] * 2, costs)
    requests = [SimRequest(i, 0.05 * i, 10, int(length), length) for i, length in enumerate(MIX * 12)]
    outcomes = simulator.run(requests)
    assert all(o.status == "served" for o in outcomes)
    late = outcomes[60:]  # once 50 predictions are seen every prompt has a home
    long_homes = {o.instance for o in late if o.request.predicted_tokens == 500.0}
    short_homes = {o.instance for o in late if o.request.predicted_tokens == 20.0}
    assert len(long_homes) == 1 and long_homes.isdisjoint(short_homes)
