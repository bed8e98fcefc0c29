"""Discrete-event simulation of N workers served by one SchedulingPolicy on a virtual clock.

Events are arrivals (from the workload arrays), batch completions and policy timers
(flush window, starvation bound, deadline). The simulator calls the policy exactly as the
Triton scheduler model does — submit, next_batch for each idle worker, on_batch_done with
measured step time and free KV, expire — so what is measured here is the production logic.

KV model: static batching keeps every row's cache until the batch ends, so a batch needs
Σ (l_in + l_out) tokens of KV. A batch that needs more than the worker's capacity η is run
in ⌈demand/η⌉ passes (preempt and recompute), which multiplies its time: the cost a static B
pays for ignoring memory.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from specbatch.scheduling.config import PolicyConfig
from specbatch.scheduling.errors import SimulationConfigError
from specbatch.scheduling.policy import SchedulingPolicy
from specbatch.scheduling.requests import Batch, QueuedRequest
from specbatch.scheduling.simulate.metrics import SimulationMetrics, summarize
from specbatch.scheduling.simulate.service import ServiceTimeModel
from specbatch.scheduling.simulate.workload import Workload

_DONE, _TICK = 0, 1


@dataclass(frozen=True)
class ClusterConfig:
    """The simulated servers: how many, how fast, how much KV, and the per-token SLA to account."""

    num_servers: int = 1
    service: ServiceTimeModel = field(default_factory=ServiceTimeModel)
    kv_capacity_tokens: int | None = None
    sla_tpot_s: float | None = None

    def __post_init__(self) -> None:
        if (
            isinstance(self.num_servers, bool)
            or not isinstance(self.num_servers, int)
            or self.num_servers < 1
        ):
            raise SimulationConfigError(f"num_servers must be an int >= 1, got {self.num_servers!r}")
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < 1:
            raise SimulationConfigError(f"kv_capacity_tokens must be >= 1, got {self.kv_capacity_tokens}")
        if self.sla_tpot_s is not None and not self.sla_tpot_s > 0:
            raise SimulationConfigError(f"sla_tpot_s must be > 0, got {self.sla_tpot_s}")


@dataclass
class BatchRecord:
    """One executed batch, for metrics and plots."""

    worker: int
    start_s: float
    end_s: float
    size: int
    bin_index: int
    max_len: float
    kv_demand_tokens: float
    passes: int
    step_seconds: float
    target_size: int
    b_mem: int | None
    b_sla: int | None


@dataclass
class RequestOutcome:
    """Per-request arrays (index = request number); NaN where the request never ran."""

    start_s: np.ndarray
    finish_s: np.ndarray
    step_seconds: np.ndarray
    bin_index: np.ndarray
    expired: np.ndarray


@dataclass
class SimulationResult:
    metrics: SimulationMetrics
    batches: list[BatchRecord]
    outcome: RequestOutcome


class Simulator:
    """Runs one workload under one policy configuration on a cluster; deterministic for a given workload."""

    def __init__(self, policy_config: PolicyConfig, cluster: ClusterConfig) -> None:
        self._policy_config = policy_config
        self._cluster = cluster

    def run(
        self, workload: Workload, horizon_s: float, *, warmup_s: float = 0.0, drain_s: float = 0.0
    ) -> SimulationResult:
        """Simulate arrivals up to ``horizon_s`` and keep serving ``drain_s`` longer.

        Throughput and utilisation are measured over [warmup_s, horizon_s]; latency and SLA
        over the requests arriving in that window (those still unserved at the end count as
        violations).
        """
        if not 0 <= warmup_s < horizon_s:
            raise SimulationConfigError(f"need 0 <= warmup_s < horizon_s, got {warmup_s}, {horizon_s}")
        if drain_s < 0:
            raise SimulationConfigError(f"drain_s must be >= 0, got {drain_s}")
        run = _Run(self._policy_config, self._cluster, workload)
        run.execute(horizon_s + drain_s)
        metrics = summarize(
            workload,
            run.outcome,
            run.batches,
            self._cluster,
            self._policy_config.num_bins,
            warmup_s=warmup_s,
            horizon_s=horizon_s,
        )
        return SimulationResult(metrics, run.batches, run.outcome)


class _Run:
    """The mutable state of one simulation run."""

    def __init__(self, config: PolicyConfig, cluster: ClusterConfig, workload: Workload) -> None:
        self.cluster = cluster
        self.workload = workload
        self.workers = [f"w{i}" for i in range(cluster.num_servers)]
        self.policy = SchedulingPolicy(config, self.workers)
        if cluster.kv_capacity_tokens is not None:
            for worker in self.workers:
                self.policy.report_free_kv(worker, cluster.kv_capacity_tokens)
        n = len(workload)
        self.outcome = RequestOutcome(
            start_s=np.full(n, np.nan),
            finish_s=np.full(n, np.nan),
            step_seconds=np.full(n, np.nan),
            bin_index=np.full(n, -1, dtype=np.int64),
            expired=np.zeros(n, dtype=bool),
        )
        self.batches: list[BatchRecord] = []
        self.events: list[tuple[float, int, int, int, Batch | None]] = []
        self.sequence = 0
        self.idle = [True] * cluster.num_servers
        self.pending_tick: float | None = None

    def execute(self, end_s: float) -> None:
        workload = self.workload
        arrivals = workload.arrival_s
        deadlines = workload.deadline_s
        inputs = workload.input_tokens
        predicted = workload.predicted_tokens
        count = len(workload)
        next_arrival = 0
        has_deadlines = deadlines is not None
        while True:
            t_arrival = arrivals[next_arrival] if next_arrival < count else math.inf
            t_event = self.events[0][0] if self.events else math.inf
            now = min(t_arrival, t_event)
            if now > end_s or now == math.inf:
                return
            if t_arrival <= t_event:
                i = next_arrival
                next_arrival += 1
                request = QueuedRequest(
                    request_id=i,
                    predicted_tokens=float(predicted[i]),
                    input_tokens=int(inputs[i]),
                    arrival_s=float(t_arrival),
                    deadline_s=float(deadlines[i]) if has_deadlines else None,
                )
                self.policy.submit(request, now)
            else:
                _, _, kind, worker, batch = heapq.heappop(self.events)
                if kind == _DONE:
                    self._complete(worker, batch, now)
                elif self.pending_tick is not None and now >= self.pending_tick:
                    self.pending_tick = None
            if has_deadlines:
                for request in self.policy.expire(now):
                    self.outcome.expired[request.request_id] = True
            self._dispatch(now)

    def _dispatch(self, now: float) -> None:
        any_idle = False
        for index, idle in enumerate(self.idle):
            if not idle:
                continue
            batch = self.policy.next_batch(self.workers[index], now)
            if batch is None:
                any_idle = True
                continue
            self._start(index, batch, now)
        if any_idle and self.policy.queued:
            wake = self.policy.next_wakeup_s(now)
            if wake is not None and (self.pending_tick is None or wake < self.pending_tick):
                self.pending_tick = wake
                self._push(wake, _TICK, -1, None)

    def _start(self, worker: int, batch: Batch, now: float) -> None:
        ids = [r.request_id for r in batch.requests]
        outputs = self.workload.output_tokens[ids]
        demand = float(np.sum(outputs) + np.sum(self.workload.input_tokens[ids]))
        capacity = self.cluster.kv_capacity_tokens
        passes = math.ceil(demand / capacity) if capacity is not None and demand > capacity else 1
        step = self.cluster.service.step_seconds(batch.size) * passes
        max_len = float(np.max(outputs))
        end = now + self.cluster.service.a0 + step * max_len
        out = self.outcome
        out.start_s[ids] = now
        out.finish_s[ids] = now + self.cluster.service.a0 + step * outputs
        out.step_seconds[ids] = step
        out.bin_index[ids] = batch.bin_index
        self.idle[worker] = False
        self.batches.append(
            BatchRecord(
                worker=worker,
                start_s=now,
                end_s=end,
                size=batch.size,
                bin_index=batch.bin_index,
                max_len=max_len,
                kv_demand_tokens=demand,
                passes=passes,
                step_seconds=step,
                target_size=batch.target_size,
                b_mem=batch.b_mem,
                b_sla=batch.b_sla,
            )
        )
        self._push(end, _DONE, worker, batch)

    def _complete(self, worker: int, batch: Batch, now: float) -> None:
        ids = [r.request_id for r in batch.requests]
        self.policy.on_batch_done(
            self.workers[worker],
            batch,
            now,
            seconds_per_token=float(self.outcome.step_seconds[ids[0]]),
            free_kv_tokens=self.cluster.kv_capacity_tokens,
            output_tokens=self.workload.output_tokens[ids].tolist(),
        )
        self.idle[worker] = True

    def _push(self, time: float, kind: int, worker: int, batch: Batch | None) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (time, self.sequence, kind, worker, batch))
