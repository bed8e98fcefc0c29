"""SchedulingPolicy: batch formation, waiting rules, deadlines, feedback and error handling."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specbatch.scheduling import (
    DuplicateRequestError,
    InvalidPolicyInputError,
    QueuedRequest,
    UnknownWorkerError,
)
from specbatch.scheduling.static import PolicyConfig, SchedulingPolicy, WorkerStateError, memory_batch_size


def _request(
    i: int, predicted: float, arrival: float = 0.0, *, deadline: float | None = None, inputs: int = 10
):
    return QueuedRequest(
        request_id=i, predicted_tokens=predicted, input_tokens=inputs, arrival_s=arrival, deadline_s=deadline
    )


def _ids(batch) -> list:
    return [r.request_id for r in batch.requests]


def _drain(policy: SchedulingPolicy, now: float, worker: str = "w") -> list[list]:
    taken = []
    while (batch := policy.next_batch(worker, now)) is not None:
        taken.append(_ids(batch))
        policy.on_batch_failed(worker, batch, now)
    return taken


def test_plain_fifo_static_b_is_the_baseline_policy() -> None:
    config = PolicyConfig(num_bins=1, fixed_batch_size=3, dynamic=False, flush_window_s=None, max_len=100)
    policy = SchedulingPolicy(config, ["w"])
    for i in range(8):
        policy.submit(_request(i, predicted=(i * 37) % 100, arrival=i), float(i))
    assert _drain(policy, 8.0) == [[0, 1, 2], [3, 4, 5]]
    assert policy.queued == 2, "without a flush window a partial batch waits"


def test_fixed_b_mode_forms_exact_batches_into_a_central_fifo() -> None:
    config = PolicyConfig(
        num_bins=2,
        boundaries="fixed",
        max_len=100,
        fixed_batch_size=2,
        dynamic=False,
        flush_window_s=None,
        starvation_bound_s=None,
    )
    policy = SchedulingPolicy(config, ["a", "b"])
    for i, predicted in enumerate([90, 10, 95, 80, 20, 5]):
        policy.submit(_request(i, predicted, arrival=i), float(i))
    assert policy.snapshot()["formed_batches"] == 2
    assert policy.snapshot()["queue_depth"] == [1, 1]
    first = policy.next_batch("b", 6.0)
    second = policy.next_batch("a", 6.0)
    assert (_ids(first), first.bin_index) == ([0, 2], 1)
    assert (_ids(second), second.bin_index) == ([1, 4], 0)
    assert all(b.size == 2 for b in (first, second))
    policy.on_batch_failed("b", first, 6.0)
    assert policy.next_batch("b", 100.0) is None, "partial bins wait for B without a flush window"


def test_flush_window_dispatches_a_partial_batch_once_the_head_waited_long_enough() -> None:
    config = PolicyConfig(num_bins=1, fixed_batch_size=4, dynamic=False, flush_window_s=0.5, max_len=100)
    policy = SchedulingPolicy(config, ["w"])
    policy.submit(_request(0, 10, arrival=1.0), 1.0)
    policy.submit(_request(1, 10, arrival=1.2), 1.2)
    assert policy.next_batch("w", 1.4) is None
    assert policy.next_wakeup_s(1.4) == pytest.approx(1.5)
    batch = policy.next_batch("w", 1.5)
    assert _ids(batch) == [0, 1]
    assert batch.target_size == 4


def test_on_demand_batches_wait_for_the_target_size_or_the_flush_window() -> None:
    config = PolicyConfig(num_bins=1, dynamic=False, b_max=3, flush_window_s=1.0, max_len=100)
    policy = SchedulingPolicy(config, ["w"])
    policy.submit(_request(0, 10, arrival=0.0), 0.0)
    assert policy.next_batch("w", 0.5) is None
    for i in (1, 2, 3):
        policy.submit(_request(i, 10, arrival=0.6), 0.6)
    batch = policy.next_batch("w", 0.6)
    assert _ids(batch) == [0, 1, 2], "a full batch goes at once; the rest stays at the front"
    policy.on_batch_failed("w", batch, 0.6)
    assert policy.next_batch("w", 1.0) is None
    assert _ids(policy.next_batch("w", 1.6)) == [3]


def test_starvation_bound_serves_a_bin_that_longest_queue_would_starve() -> None:
    config = PolicyConfig(
        num_bins=2,
        boundaries="fixed",
        max_len=100,
        dynamic=False,
        b_max=2,
        flush_window_s=0.0,
        bin_selection="longest_queue",
        starvation_bound_s=10.0,
    )
    policy = SchedulingPolicy(config, ["w"])
    policy.submit(_request("short", 10, arrival=0.0), 0.0)
    next_id = 0
    chosen_bins = []
    for now in range(0, 16):
        for _ in range(3):
            policy.submit(_request(next_id, 90, arrival=float(now)), float(now))
            next_id += 1
        batch = policy.next_batch("w", float(now))
        chosen_bins.append((now, batch.bin_index))
        policy.on_batch_failed("w", batch, float(now))
    assert [now for now, b in chosen_bins if b == 0] == [10]


@pytest.mark.parametrize(
    ("rule", "expected"),
    [("oldest_head", [1, 0, 2]), ("longest_queue", [2, 1, 0]), ("round_robin", [0, 1, 2])],
)
def test_bin_selection_rules(rule: str, expected: list[int]) -> None:
    config = PolicyConfig(
        num_bins=3,
        boundaries="fixed",
        max_len=90,
        dynamic=False,
        b_max=10,
        flush_window_s=0.0,
        bin_selection=rule,
        starvation_bound_s=None,
    )
    policy = SchedulingPolicy(config, ["w"])
    arrivals = [(0, 10, 1.0), (1, 40, 0.5), (2, 70, 2.0), (3, 75, 2.1), (4, 80, 2.2), (5, 45, 2.3)]
    for i, predicted, arrival in arrivals:
        policy.submit(_request(i, predicted, arrival=arrival), arrival)
    order = []
    while (batch := policy.next_batch("w", 3.0)) is not None:
        order.append(batch.bin_index)
        policy.on_batch_failed("w", batch, 3.0)
    assert order == expected


def _dynamic_policy(**overrides) -> SchedulingPolicy:
    params = {
        "num_bins": 2,
        "boundaries": "fixed",
        "max_len": 1000,
        "b_max": 64,
        "flush_window_s": 0.0,
        "stats_min_samples": 4,
        "eps_mem": 0.05,
    }
    params.update(overrides)
    return SchedulingPolicy(PolicyConfig(**params), ["w"])


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(
        st.tuples(st.integers(0, 1000), st.integers(0, 500), st.integers(0, 1200)), min_size=1, max_size=120
    ),
    free_kv=st.lists(st.integers(0, 40_000), min_size=1, max_size=30),
)
def test_batch_size_never_exceeds_b_mem(requests: list[tuple[int, int, int]], free_kv: list[int]) -> None:
    policy = _dynamic_policy()
    policy.report_free_kv("w", free_kv[0])
    truth = {}
    for i, (predicted, inputs, actual) in enumerate(requests):
        policy.submit(_request(i, predicted, inputs=inputs), 0.0)
        truth[i] = actual
    for step in range(len(requests)):
        batch = policy.next_batch("w", 1.0)
        if batch is None:
            break
        assert batch.b_mem is not None
        assert batch.size <= batch.b_mem
        assert batch.size <= batch.target_size
        policy.on_batch_done(
            "w",
            batch,
            1.0,
            seconds_per_token=0.01,
            free_kv_tokens=free_kv[step % len(free_kv)],
            output_tokens=[truth[r.request_id] for r in batch.requests],
        )
    assert policy.queued == 0 or policy.next_batch("w", 1.0) is None


def test_b_mem_follows_the_reported_free_kv_and_the_bin_statistics() -> None:
    policy = _dynamic_policy(num_bins=1, stats_min_samples=1)
    policy.report_free_kv("w", 5_000)
    for i in range(30):
        policy.submit(_request(i, 400, inputs=100), 0.0)
    batch = policy.next_batch("w", 0.0)
    assert batch.b_mem == memory_batch_size(5_000, 500.0, 0.0, 0.05, 1, 64).b_mem == 10
    assert batch.size == 10
    policy.on_batch_done(
        "w", batch, 1.0, seconds_per_token=0.01, free_kv_tokens=2_000, output_tokens=[400] * 10
    )
    assert policy.next_batch("w", 1.0).size == 4


def test_sla_feedback_moves_b_sla_the_right_way() -> None:
    policy = _dynamic_policy(num_bins=1, d_sla_s=0.05, eps_d=0.005, latency_window=1)
    for i in range(200):
        policy.submit(_request(i, 100), 0.0)
    start = policy.snapshot()["workers"]["w"]["b_sla"]
    batch = policy.next_batch("w", 0.0)
    assert batch.size == start == batch.b_sla
    policy.on_batch_done(
        "w", batch, 1.0, seconds_per_token=0.5, free_kv_tokens=None, output_tokens=[1] * batch.size
    )
    lowered = policy.snapshot()["workers"]["w"]["b_sla"]
    assert lowered < start
    batch = policy.next_batch("w", 1.0)
    assert batch.size == lowered
    policy.on_batch_done(
        "w", batch, 2.0, seconds_per_token=0.001, free_kv_tokens=None, output_tokens=[1] * batch.size
    )
    assert policy.snapshot()["workers"]["w"]["b_sla"] > lowered


def test_expired_requests_are_returned_and_never_run() -> None:
    config = PolicyConfig(num_bins=1, dynamic=False, b_max=10, flush_window_s=0.0, max_len=100)
    policy = SchedulingPolicy(config, ["w"])
    policy.submit(_request(0, 10, arrival=0.0, deadline=1.0), 0.0)
    policy.submit(_request(1, 10, arrival=0.0, deadline=5.0), 0.0)
    policy.submit(_request(2, 10, arrival=0.0), 0.0)
    assert policy.next_wakeup_s(0.0) == 1.0
    batch = policy.next_batch("w", 2.0)
    assert _ids(batch) == [1, 2]
    assert [r.request_id for r in policy.expire(2.0)] == [0]
    assert policy.expire(2.0) == []


def test_expiry_also_removes_requests_from_formed_batches() -> None:
    config = PolicyConfig(num_bins=1, fixed_batch_size=2, dynamic=False, flush_window_s=None, max_len=100)
    policy = SchedulingPolicy(config, ["w"])
    policy.submit(_request(0, 10, deadline=1.0), 0.0)
    policy.submit(_request(1, 10), 0.0)
    assert [r.request_id for r in policy.expire(1.0)] == [0]
    assert _ids(policy.next_batch("w", 1.0)) == [1]


def test_next_wakeup_reports_the_earliest_future_timer() -> None:
    config = PolicyConfig(
        num_bins=1, dynamic=False, b_max=10, flush_window_s=2.0, starvation_bound_s=5.0, max_len=100
    )
    policy = SchedulingPolicy(config, ["w"])
    assert policy.next_wakeup_s(0.0) is None
    policy.submit(_request(0, 10, arrival=1.0, deadline=2.5), 1.0)
    assert policy.next_wakeup_s(1.0) == 2.5
    assert policy.next_wakeup_s(2.6) == 3.0
    assert policy.next_wakeup_s(3.0) == 6.0


def test_cancel_removes_a_queued_request() -> None:
    config = PolicyConfig(num_bins=1, dynamic=False, b_max=10, flush_window_s=0.0, max_len=100)
    policy = SchedulingPolicy(config, ["w"])
    for i in range(3):
        policy.submit(_request(i, 10), 0.0)
    assert policy.cancel(1).request_id == 1
    assert policy.cancel(1) is None
    assert _ids(policy.next_batch("w", 0.0)) == [0, 2]


def test_misuse_is_reported_clearly() -> None:
    config = PolicyConfig(num_bins=1, dynamic=False, b_max=2, flush_window_s=0.0, max_len=100)
    policy = SchedulingPolicy(config, ["w"])
    policy.submit(_request(0, 10), 0.0)
    with pytest.raises(DuplicateRequestError):
        policy.submit(_request(0, 10), 0.0)
    with pytest.raises(UnknownWorkerError):
        policy.next_batch("nope", 0.0)
    batch = policy.next_batch("w", 0.0)
    with pytest.raises(WorkerStateError):
        policy.next_batch("w", 0.0)
    with pytest.raises(InvalidPolicyInputError, match="output_tokens"):
        policy.on_batch_done("w", batch, 1.0, seconds_per_token=0.01, free_kv_tokens=10, output_tokens=[1, 2])
    policy.on_batch_done("w", batch, 1.0, seconds_per_token=0.01, free_kv_tokens=10, output_tokens=[1])
    with pytest.raises(WorkerStateError):
        policy.on_batch_done("w", batch, 1.0, seconds_per_token=0.01, free_kv_tokens=10, output_tokens=[1])
    with pytest.raises(InvalidPolicyInputError, match="predicted_tokens"):
        _request(1, -3)
    with pytest.raises(InvalidPolicyInputError, match="input_tokens"):
        _request(1, 3, inputs=-1)


def test_snapshot_reports_queues_and_worker_bounds() -> None:
    policy = _dynamic_policy(d_sla_s=0.05)
    policy.report_free_kv("w", 10_000)
    policy.submit(_request(0, 100), 0.0)
    policy.submit(_request(1, 900), 0.0)
    snap = policy.snapshot()
    assert snap["queue_depth"] == [1, 1]
    assert snap["boundaries"] == [500.0]
    assert snap["workers"]["w"]["free_kv_tokens"] == 10_000
    batch = policy.next_batch("w", 0.0)
    snap = policy.snapshot()
    assert snap["workers"]["w"]["busy"] is True
    assert snap["workers"]["w"]["b_mem"] == batch.b_mem
    assert snap["workers"]["w"]["last_batch_size"] == 1


def test_candidates_that_do_not_fit_the_free_kv_stay_at_the_front() -> None:
    # eps_mem = 0.45 keeps the CLT margin small: b_mem = 11, so only the candidate check stops at 10.
    policy = _dynamic_policy(num_bins=1, stats_min_samples=1, eps_mem=0.45)
    policy.report_free_kv("w", 8_000)
    for i in range(10):
        policy.submit(_request(i, 400, inputs=100), 0.0)
    policy.submit(_request(10, 400, inputs=3_000), 0.0)
    for i in range(11, 20):
        policy.submit(_request(i, 400, inputs=100), 0.0)
    first = policy.next_batch("w", 0.0)
    policy.on_batch_failed("w", first, 0.0)
    second = policy.next_batch("w", 0.0)
    assert first.b_mem == 11
    assert _ids(first) == list(range(10))
    assert _ids(second)[:1] == [10], "the long prompt heads the next batch"
    assert sum(r.input_tokens + r.predicted_tokens for r in second.requests) <= 8_000


def test_a_formed_batch_that_lost_members_is_topped_up_from_its_bin() -> None:
    config = PolicyConfig(num_bins=1, fixed_batch_size=3, dynamic=False, flush_window_s=None, max_len=100)
    policy = SchedulingPolicy(config, ["w"])
    for i in range(5):
        policy.submit(_request(i, 10, arrival=float(i)), float(i))
    assert policy.cancel(1).request_id == 1
    assert _ids(policy.next_batch("w", 5.0)) == [0, 2, 3]
    assert policy.queued == 1
