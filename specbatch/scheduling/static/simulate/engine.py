"""Discrete-event simulation of N workers served by one static SchedulingPolicy on a virtual clock.

Events are arrivals (from the workload arrays), batch completions and policy timers
(flush window, starvation bound, deadline). The simulator makes the calls a batch-level
scheduler makes — submit, next_batch for each idle worker, on_batch_done with measured step
time and free KV, expire — so what is measured is the static policy's own decisions. The live
server runs the admission policy instead; ``specbatch.scheduling.simulate.continuous``
simulates that one, step by step.

KV model: static batching keeps every row's cache until the batch ends, so a batch needs
Σ (l_in + l_out) tokens of KV. A batch that needs more than the worker's capacity η is run
in ⌈demand/η⌉ passes (preempt and recompute), which multiplies its time: the cost a static B
pays for ignoring memory.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from specbatch.scheduling.requests import QueuedRequest
from specbatch.scheduling.static.batch import Batch
from specbatch.scheduling.static.config import PolicyConfig
from specbatch.scheduling.static.errors import SimulationConfigError
from specbatch.scheduling.static.policy import SchedulingPolicy
from specbatch.scheduling.static.simulate.cluster import ClusterConfig
from specbatch.scheduling.static.simulate.metrics import SimulationMetrics, summarize
from specbatch.scheduling.static.simulate.records import BatchRecord, RequestOutcome
from specbatch.scheduling.static.simulate.workload import SimulatedWorkload

_DONE, _TICK = 0, 1


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
        self, workload: SimulatedWorkload, horizon_s: float, *, warmup_s: float = 0.0, drain_s: float = 0.0
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

    def __init__(self, config: PolicyConfig, cluster: ClusterConfig, workload: SimulatedWorkload) -> None:
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
