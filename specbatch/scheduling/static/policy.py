"""SchedulingPolicy: the batch-level policy of the papers, multi-bin queues + dynamic batch size.

An idle worker asks for a batch, runs it to completion and reports back: the setting of
Guldogan et al. (2024) and Pang et al. (2025). The live server does not run this policy; its
instances batch at every step, and it admits prompts to them with
``specbatch.scheduling.admission``. This policy runs in the discrete-event simulator
(``specbatch.scheduling.static.simulate``), which reproduces the papers' results with it.

The policy never reads a clock, sleeps or starts a thread: every method takes ``now_s`` from
the caller, so a virtual clock drives it exactly as a wall clock would.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

from specbatch.scheduling.dynamic import RunningStats, SlaBatchController
from specbatch.scheduling.errors import DuplicateRequestError, InvalidPolicyInputError, UnknownWorkerError
from specbatch.scheduling.requests import QueuedRequest
from specbatch.scheduling.static.batch import Batch
from specbatch.scheduling.static.bins import BinQueues
from specbatch.scheduling.static.config import PolicyConfig
from specbatch.scheduling.static.errors import WorkerStateError
from specbatch.scheduling.static.memory import memory_batch_size

logger = logging.getLogger(__name__)


@dataclass
class _WorkerState:
    free_kv_tokens: int | None = None
    sla: SlaBatchController | None = None
    in_flight: Batch | None = None
    last_b_mem: int | None = None
    last_batch_size: int | None = None
    batches_done: int = 0


@dataclass
class _TokenStats:
    """Per-request KV tokens (l_in + l_out): from finished requests, globally and per bin."""

    completed: RunningStats = field(default_factory=RunningStats)
    completed_per_bin: list[RunningStats] = field(default_factory=list)
    predicted: RunningStats = field(default_factory=RunningStats)
    predicted_per_bin: list[RunningStats] = field(default_factory=list)


class SchedulingPolicy:
    """Decides which queued requests run together, on which idle worker, and when.

    Call :meth:`submit` on arrival, :meth:`next_batch` whenever a worker is idle,
    :meth:`on_batch_done` with the worker's measurements when its batch finishes, and
    :meth:`expire` / :meth:`next_wakeup_s` to fail late requests and to know when to look again.

    Not thread-safe: the owner (one scheduler thread, or callers holding one lock) serialises calls.
    """

    def __init__(self, config: PolicyConfig, workers: Sequence[str]) -> None:
        if isinstance(workers, str) or not workers:
            raise UnknownWorkerError("workers must be a non-empty sequence of worker ids")
        if len(set(workers)) != len(workers):
            raise UnknownWorkerError(f"worker ids must be unique, got {list(workers)}")
        self._cfg = config
        self._boundaries = config.bin_boundaries()
        self._queues = BinQueues(config.num_bins)
        self._formed: deque[Batch] = deque()
        self._bin_of: dict[Hashable, int] = {}
        self._formed_of: dict[Hashable, Batch] = {}
        self._deadlines: list[tuple[float, int, Hashable]] = []
        self._sequence = itertools.count()
        self._batch_ids = itertools.count()
        self._expired: list[QueuedRequest] = []
        self._round_robin_next = 0
        self._stats = _TokenStats(
            completed_per_bin=[RunningStats() for _ in range(config.num_bins)],
            predicted_per_bin=[RunningStats() for _ in range(config.num_bins)],
        )
        self._workers = {w: _WorkerState(sla=self._new_sla_controller()) for w in workers}
        self._theta = NormalDist().inv_cdf(1.0 - config.eps_mem)

    @property
    def config(self) -> PolicyConfig:
        return self._cfg

    @property
    def queued(self) -> int:
        """Requests waiting: in bins plus in formed batches not yet dispatched."""
        return len(self._bin_of) + len(self._formed_of)

    # ---------------------------------------------------------------- events

    def submit(self, request: QueuedRequest, now_s: float) -> None:
        """Queue a request in the bin its predicted length falls in."""
        if not isinstance(request, QueuedRequest):
            raise InvalidPolicyInputError(f"submit expects a QueuedRequest, got {type(request).__name__}")
        if request.request_id in self._bin_of or request.request_id in self._formed_of:
            raise DuplicateRequestError(f"request id {request.request_id!r} is already queued")
        self._boundaries.observe(request.predicted_tokens)
        bin_index = self._boundaries.assign(request.predicted_tokens)
        self._queues.push(bin_index, request)
        self._bin_of[request.request_id] = bin_index
        self._stats.predicted.add(request.input_tokens + request.predicted_tokens)
        self._stats.predicted_per_bin[bin_index].add(request.input_tokens + request.predicted_tokens)
        if request.deadline_s is not None:
            heapq.heappush(self._deadlines, (request.deadline_s, next(self._sequence), request.request_id))
        if self._cfg.fixed_batch_size is not None:
            size = self._cfg.fixed_batch_size
            while self._queues.depth(bin_index) >= size:
                self._formed.append(self._form(bin_index, size, now_s, target=size))

    def next_batch(self, worker_id: str, now_s: float) -> Batch | None:
        """The batch this idle worker should run now, or None when nothing is ready yet."""
        worker = self._worker(worker_id)
        if worker.in_flight is not None:
            raise WorkerStateError(
                f"worker {worker_id!r} still runs batch {worker.in_flight.batch_id}; "
                "report it with on_batch_done or on_batch_failed first"
            )
        self._move_expired(now_s)
        if self._cfg.fixed_batch_size is not None:
            batch = self._next_formed_batch(now_s)
        else:
            batch = self._next_on_demand_batch(worker, now_s)
        if batch is not None:
            worker.in_flight = batch
            worker.last_batch_size = batch.size
            for request in batch.requests:
                self._formed_of.pop(request.request_id, None)
        return batch

    def on_batch_done(
        self,
        worker_id: str,
        batch: Batch,
        now_s: float,
        *,
        seconds_per_token: float,
        free_kv_tokens: int | None,
        output_tokens: Sequence[int],
    ) -> None:
        """Worker feedback: measured decode latency (b_SLA), free KV (b_mem), true lengths (stats).

        ``free_kv_tokens`` is the KV capacity free once the batch has left the worker; None keeps
        the last report (a worker that cannot measure it).
        """
        if len(output_tokens) != batch.size:
            raise InvalidPolicyInputError(
                f"batch {batch.batch_id} has {batch.size} requests but {len(output_tokens)} output_tokens"
            )
        if not _is_count(seconds_per_token):
            raise InvalidPolicyInputError(
                f"seconds_per_token must be a finite number >= 0, got {seconds_per_token!r}"
            )
        if not all(_is_count(n) for n in output_tokens):
            raise InvalidPolicyInputError(
                f"output_tokens must be finite numbers >= 0, got {list(output_tokens)!r}"
            )
        free_kv = None if free_kv_tokens is None else _checked_kv(free_kv_tokens)
        worker = self._finish(worker_id, batch)
        if free_kv is not None:
            worker.free_kv_tokens = free_kv
        for request, produced in zip(batch.requests, output_tokens, strict=True):
            total = request.input_tokens + produced
            self._stats.completed.add(total)
            self._stats.completed_per_bin[batch.bin_index].add(total)
        if worker.sla is not None:
            worker.sla.update(seconds_per_token, batch.size)
        worker.batches_done += 1

    def on_batch_failed(self, worker_id: str, batch: Batch, now_s: float) -> None:
        """Free a worker whose batch failed or measured nothing; b_SLA and the statistics stay unchanged."""
        self._finish(worker_id, batch)
        logger.debug(
            "batch %d released from worker %s at %.3f without feedback", batch.batch_id, worker_id, now_s
        )

    def report_free_kv(self, worker_id: str, free_kv_tokens: int) -> None:
        """Capacity report (tokens of KV cache free when the worker is idle), e.g. at start-up."""
        self._worker(worker_id).free_kv_tokens = _checked_kv(free_kv_tokens)

    def expire(self, now_s: float) -> list[QueuedRequest]:
        """Remove and return every queued request whose deadline is at or before ``now_s``."""
        self._move_expired(now_s)
        expired, self._expired = self._expired, []
        return expired

    def cancel(self, request_id: Hashable) -> QueuedRequest | None:
        """Remove a queued request (the client went away); None if it is not queued."""
        return self._remove(request_id)

    def next_wakeup_s(self, now_s: float) -> float | None:
        """Earliest time after ``now_s`` at which a flush window, starvation bound or deadline elapses."""
        candidates = []
        for bin_index in self._queues.nonempty():
            head = self._queues.head(bin_index)
            for bound in (self._cfg.flush_window_s, self._cfg.starvation_bound_s):
                if bound is not None and head.arrival_s + bound > now_s:
                    candidates.append(head.arrival_s + bound)
        deadline = self._earliest_live_deadline()
        if deadline is not None and deadline > now_s:
            candidates.append(deadline)
        return min(candidates, default=None)

    def snapshot(self) -> dict:
        """State for metrics: per-bin depth, bin edges, and each worker's last bounds and batch size."""
        return {
            "num_bins": self._cfg.num_bins,
            "boundaries": self._boundaries.cuts,
            "queue_depth": self._queues.depths(),
            "formed_batches": len(self._formed),
            "queued": self.queued,
            "workers": {
                worker_id: {
                    "busy": state.in_flight is not None,
                    "free_kv_tokens": state.free_kv_tokens,
                    "b_mem": state.last_b_mem,
                    "b_sla": state.sla.b_sla if state.sla is not None else None,
                    "moving_latency_s": state.sla.moving_latency_s if state.sla is not None else None,
                    "last_batch_size": state.last_batch_size,
                    "batches_done": state.batches_done,
                }
                for worker_id, state in self._workers.items()
            },
        }

    # ------------------------------------------------------ batch formation

    def _next_formed_batch(self, now_s: float) -> Batch | None:
        """Fixed-B mode: pop the central FIFO; partial batches only for starving or flushed bins."""
        size = self._cfg.fixed_batch_size
        starving = self._bins_waiting(now_s, self._cfg.starvation_bound_s)
        if starving:
            chosen = min(starving, key=lambda i: (self._queues.head(i).arrival_s, i))
            self._formed.appendleft(self._form(chosen, size, now_s, target=size))
        while self._formed:
            batch = self._top_up(self._formed.popleft(), size)
            if batch.requests:
                return batch
        due = self._bins_waiting(now_s, self._cfg.flush_window_s)
        if not due:
            return None
        return self._form(self._select(due), size, now_s, target=size)

    def _top_up(self, batch: Batch, size: int) -> Batch:
        """Refill a formed batch that lost members to expiry or cancellation from the front of its bin.

        Everything in the bin arrived after the batch was formed, so FIFO order is kept, and the
        worker does not run a part-empty batch while its bin has requests waiting.
        """
        missing = size - batch.size
        if missing > 0:
            extra = self._queues.pop_front(batch.bin_index, missing)
            for request in extra:
                del self._bin_of[request.request_id]
            batch.requests.extend(extra)
        return batch

    def _next_on_demand_batch(self, worker: _WorkerState, now_s: float) -> Batch | None:
        """Dynamic / on-demand mode: pick a bin, take up to the target size from its front."""
        targets = {i: self._target_size(worker, i) for i in self._queues.nonempty()}
        if not targets:
            return None
        starving = self._bins_waiting(now_s, self._cfg.starvation_bound_s)
        if starving:
            chosen = min(starving, key=lambda i: (self._queues.head(i).arrival_s, i))
        else:
            flushable = set(self._bins_waiting(now_s, self._cfg.flush_window_s))
            ready = [i for i, b in targets.items() if self._queues.depth(i) >= b[0] or i in flushable]
            if not ready:
                return None
            chosen = self._select(ready)
        size, b_mem, b_sla = targets[chosen]
        worker.last_b_mem = b_mem
        size = self._fit_candidates(worker, chosen, size)
        return self._form(chosen, size, now_s, target=size, b_mem=b_mem, b_sla=b_sla)

    def _fit_candidates(self, worker: _WorkerState, bin_index: int, size: int) -> int:
        """Shrink the batch until the candidates' own tokens fit in the free KV.

        b_mem rests on running averages, which are blind at start-up and to a run of long
        prompts; the candidates' input tokens are known and their output tokens predicted, so
        the batch is cut to the longest prefix whose Σ(l_in + predicted l_out) plus the same
        CLT margin θ·σ·√b fits in η. Candidates left out stay at the front of their bin. Only
        ever lowers the size, so the batch stays within b_mem.
        """
        cfg = self._cfg
        stats = self._token_stats_for(bin_index)
        if not cfg.dynamic or worker.free_kv_tokens is None or stats is None:
            return size
        sigma = math.sqrt(stats.variance)
        demand = 0.0
        fitting = 0
        for count, request in enumerate(self._queues.peek(bin_index, size), start=1):
            demand += request.input_tokens + request.predicted_tokens
            if demand + self._theta * sigma * math.sqrt(count) > worker.free_kv_tokens:
                break
            fitting = count
        return max(cfg.b_min, fitting)

    def _target_size(self, worker: _WorkerState, bin_index: int) -> tuple[int, int | None, int | None]:
        """(size, b_mem, b_sla) for a batch from this bin on this worker."""
        cfg = self._cfg
        if not cfg.dynamic:
            return cfg.b_max, None, None
        b_mem = cfg.b_max
        if worker.free_kv_tokens is not None:
            stats = self._token_stats_for(bin_index)
            if stats is not None:
                b_mem = memory_batch_size(
                    worker.free_kv_tokens, stats.mean, stats.variance, cfg.eps_mem, cfg.b_min, cfg.b_max
                ).b_mem
        b_sla = worker.sla.b_sla if worker.sla is not None else None
        size = min(b_mem, b_sla) if b_sla is not None else b_mem
        return max(cfg.b_min, min(size, cfg.b_max)), b_mem, b_sla

    def _token_stats_for(self, bin_index: int) -> RunningStats | None:
        """The most specific statistics with enough samples.

        Measured totals of this bin's finished requests, else this bin's input + predicted
        tokens, else all finished requests, else all predictions. Bin-specific figures come
        first because a long bin needs far more KV per request than the global mean suggests.
        """
        minimum = self._cfg.stats_min_samples
        stats = self._stats
        for candidate in (
            stats.completed_per_bin[bin_index],
            stats.predicted_per_bin[bin_index],
            stats.completed,
        ):
            if candidate.count >= minimum:
                return candidate
        return stats.predicted if stats.predicted.count else None

    def _form(
        self,
        bin_index: int,
        size: int,
        now_s: float,
        *,
        target: int,
        b_mem: int | None = None,
        b_sla: int | None = None,
    ) -> Batch:
        requests = self._queues.pop_front(bin_index, size)
        batch = Batch(
            requests=requests,
            bin_index=bin_index,
            batch_id=next(self._batch_ids),
            formed_s=now_s,
            target_size=target,
            b_mem=b_mem,
            b_sla=b_sla,
        )
        for request in requests:
            del self._bin_of[request.request_id]
            if self._cfg.fixed_batch_size is not None:
                self._formed_of[request.request_id] = batch
        return batch

    def _bins_waiting(self, now_s: float, bound: float | None) -> list[int]:
        """Non-empty bins whose head has waited at least ``bound`` (none when the bound is off)."""
        if bound is None:
            return []
        return [i for i in self._queues.nonempty() if self._queues.head(i).arrival_s + bound <= now_s]

    def _select(self, candidates: Sequence[int]) -> int:
        rule = self._cfg.bin_selection
        if rule == "oldest_head":
            return min(candidates, key=lambda i: (self._queues.head(i).arrival_s, i))
        if rule == "longest_queue":
            return min(candidates, key=lambda i: (-self._queues.depth(i), self._queues.head(i).arrival_s, i))
        ordered = sorted(candidates, key=lambda i: (i - self._round_robin_next) % self._cfg.num_bins)
        self._round_robin_next = (ordered[0] + 1) % self._cfg.num_bins
        return ordered[0]

    # ------------------------------------------------------------- helpers

    def _new_sla_controller(self) -> SlaBatchController | None:
        cfg = self._cfg
        if not cfg.dynamic or cfg.d_sla_s is None:
            return None
        return SlaBatchController(
            cfg.d_sla_s, cfg.sla_tolerance_s, cfg.alpha, cfg.delta, cfg.b_min, cfg.b_max, cfg.latency_window
        )

    def _worker(self, worker_id: str) -> _WorkerState:
        try:
            return self._workers[worker_id]
        except KeyError:
            raise UnknownWorkerError(
                f"unknown worker {worker_id!r}; known: {sorted(self._workers)}"
            ) from None

    def _finish(self, worker_id: str, batch: Batch) -> _WorkerState:
        worker = self._worker(worker_id)
        if worker.in_flight is not batch:
            raise WorkerStateError(f"worker {worker_id!r} is not running batch {batch.batch_id}")
        worker.in_flight = None
        return worker

    def _remove(self, request_id: Hashable) -> QueuedRequest | None:
        bin_index = self._bin_of.pop(request_id, None)
        if bin_index is not None:
            return self._queues.remove(bin_index, request_id)
        batch = self._formed_of.pop(request_id, None)
        if batch is None:
            return None
        for position, request in enumerate(batch.requests):
            if request.request_id == request_id:
                return batch.requests.pop(position)
        return None

    def _earliest_live_deadline(self) -> float | None:
        while self._deadlines:
            deadline, _, request_id = self._deadlines[0]
            queued = self._bin_of.get(request_id) is not None or request_id in self._formed_of
            if queued and self._current(request_id).deadline_s == deadline:
                return deadline
            heapq.heappop(self._deadlines)
        return None

    def _current(self, request_id: Hashable) -> QueuedRequest:
        bin_index = self._bin_of.get(request_id)
        if bin_index is not None:
            return self._queues.get(bin_index, request_id)
        batch = self._formed_of[request_id]
        return next(r for r in batch.requests if r.request_id == request_id)

    def _move_expired(self, now_s: float) -> None:
        while True:
            deadline = self._earliest_live_deadline()
            if deadline is None or deadline > now_s:
                return
            _, _, request_id = heapq.heappop(self._deadlines)
            removed = self._remove(request_id)
            if removed is not None:
                self._expired.append(removed)


def _is_count(value: object) -> bool:
    """A finite, non-negative real number (token counts may be fractional in simulation)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and value >= 0


def _checked_kv(free_kv_tokens: int) -> int:
    if isinstance(free_kv_tokens, bool) or not isinstance(free_kv_tokens, int) or free_kv_tokens < 0:
        raise InvalidPolicyInputError(f"free_kv_tokens must be an int >= 0, got {free_kv_tokens!r}")
    return free_kv_tokens
