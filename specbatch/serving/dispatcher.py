"""The scheduler's wall-clock loop: queues, workers and batches, on one asyncio loop.

The policy (`specbatch.scheduling`) decides *what* runs together; this loop decides
*when*: it offers every idle worker a batch, sleeps until the policy's next deadline
or the next event (a submission, a finished batch), and reports each batch's measured
latency and free KV capacity back to the policy. mmlu scoring jobs are one prefill
each, so they skip the length bins and go out first, in FIFO batches, to whichever
worker frees up. A batch that fails fails its own prompts and nothing else.

Cancellation reaches a prompt wherever it is: a queued prompt leaves its bin at once;
a running one is marked on the cancellation board, and its model instance drops the
row at the next decode step. Prompts whose deadline passes are cancelled the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from specbatch.scheduling import Batch, QueuedRequest, SchedulingPolicy
from specbatch.serving.cancellation import CancelBoard
from specbatch.serving.outcomes import PromptOutcome
from specbatch.serving.params import SamplingParams
from specbatch.serving.tasks import GENERATE, SCORE, PreparedPrompt

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class PromptJob:
    """One prompt waiting for a model, with the callbacks that take its text and outcome."""

    key: tuple[int, int]
    prepared: PreparedPrompt
    sampling: SamplingParams
    input_tokens: int
    predicted_tokens: int
    arrival_s: float
    on_done: Callable[[PromptOutcome], None]
    deadline_s: float | None = None
    on_delta: Callable[[str], None] | None = None
    dispatched_s: float | None = None
    first_token_s: float | None = None

    @property
    def row_id(self) -> str:
        """The prompt's name on the cancellation board."""
        return f"{self.key[0]}-{self.key[1]}"


@dataclass(frozen=True)
class BatchResult:
    """A worker's answer to one batch: outcomes in job order plus its measurements."""

    outcomes: list[PromptOutcome]
    seconds_per_token: float = 0.0
    free_kv_tokens: int = 0
    first_token_s: list[float] = field(default_factory=list)


DeltaSink = Callable[[list[tuple[int, str]]], None]
RowDone = Callable[[int, PromptOutcome, float], None]


class WorkerBackend(Protocol):
    """Runs a batch on some model instance (BLS inside Triton, the engine in tests).

    `on_deltas([(row, text), ...])` receives streamed text of the batch's rows;
    `on_row_done(row, outcome, first_token_s)` a row that finished before the batch did.
    """

    async def run(
        self, kind: str, jobs: Sequence[PromptJob], on_deltas: DeltaSink, on_row_done: RowDone
    ) -> BatchResult: ...


@dataclass
class DispatchStats:
    """Counters the scheduler model turns into Prometheus metrics."""

    batches: dict[str, int] = field(default_factory=lambda: {GENERATE: 0, SCORE: 0})
    last_batch_size: dict[str, int] = field(default_factory=lambda: {GENERATE: 0, SCORE: 0})
    failed_batches: int = 0


class Dispatcher:
    """Feeds batches from the policy (and the scoring FIFO) to a fixed set of worker slots."""

    def __init__(
        self,
        policy: SchedulingPolicy,
        backend: WorkerBackend,
        workers: Sequence[str],
        *,
        score_batch_max: int = 32,
        clock: Callable[[], float] = time.monotonic,
        on_batch: Callable[[str, int, dict], None] | None = None,
        board: CancelBoard | None = None,
    ) -> None:
        if not workers:
            raise ValueError("the dispatcher needs at least one worker slot")
        self._policy = policy
        self._backend = backend
        self._idle: list[str] = list(workers)
        self._score_queue: deque[PromptJob] = deque()
        self._score_batch_max = score_batch_max
        self._clock = clock
        self._on_batch = on_batch
        self._wake = asyncio.Event()
        self._stopping = False
        self._running: set[asyncio.Task] = set()
        self._running_jobs: dict[tuple[int, int], PromptJob] = {}
        self._board = board
        self.stats = DispatchStats()

    def submit(self, job: PromptJob) -> None:
        """Queue a job; call on the dispatcher's loop (use `loop.call_soon_threadsafe`)."""
        if job.prepared.kind == SCORE:
            self._score_queue.append(job)
        elif job.prepared.kind == GENERATE:
            self._policy.submit(
                QueuedRequest(
                    request_id=job.key,
                    predicted_tokens=job.predicted_tokens,
                    input_tokens=job.input_tokens,
                    arrival_s=job.arrival_s,
                    deadline_s=job.deadline_s,
                    payload=job,
                ),
                self._clock(),
            )
        else:
            raise ValueError(f"job {job.key} needs no model (kind {job.prepared.kind!r})")
        self._wake.set()

    @property
    def queued(self) -> int:
        return len(self._score_queue) + self._policy.queued

    def snapshot(self) -> dict:
        """Policy state plus the scoring queue, for metrics."""
        return {
            **self._policy.snapshot(),
            "score_queue_depth": len(self._score_queue),
            "idle_workers": len(self._idle),
        }

    async def run(self) -> None:
        """Dispatch until `stop()`; then wait for the batches in flight."""
        while not self._stopping:
            now = self._clock()
            self._fail_expired(now)
            self._dispatch_ready(now)
            wake_at = self._next_wakeup(now)
            timeout = None if wake_at is None else max(0.0, wake_at - now)
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    def cancel(self, key: tuple[int, int], reason: str = "request cancelled") -> bool:
        """Withdraw a prompt: from its queue now, or from its running batch at the next step."""
        request = self._policy.cancel(key)
        if request is not None:
            job: PromptJob = request.payload
            job.on_done(PromptOutcome(task=job.prepared.task, finish_reason="cancelled", error=reason))
            return True
        for job in self._score_queue:
            if job.key == key:
                self._score_queue.remove(job)
                job.on_done(PromptOutcome(task=job.prepared.task, finish_reason="cancelled", error=reason))
                return True
        running = self._running_jobs.get(key)
        if running is not None and self._board is not None:
            self._board.cancel(running.row_id)
            return True
        return False

    def _fail_expired(self, now: float) -> None:
        for request in self._policy.expire(now):
            job: PromptJob = request.payload
            job.on_done(
                PromptOutcome(task=job.prepared.task, finish_reason="cancelled", error="deadline exceeded")
            )
        if self._board is not None:
            for job in self._running_jobs.values():
                if job.deadline_s is not None and job.deadline_s <= now:
                    self._board.cancel(job.row_id)

    def _next_wakeup(self, now: float) -> float | None:
        """The policy's next deadline, or a running prompt's, whichever is first."""
        times = [self._policy.next_wakeup_s(now)]
        times += [
            j.deadline_s
            for j in self._running_jobs.values()
            if j.deadline_s is not None and j.deadline_s > now
        ]
        times = [t for t in times if t is not None]
        return min(times) if times else None

    def _dispatch_ready(self, now: float) -> None:
        while self._idle:
            worker = self._idle[0]
            if self._score_queue:
                count = min(self._score_batch_max, len(self._score_queue))
                jobs = [self._score_queue.popleft() for _ in range(count)]
                self._start(worker, SCORE, jobs, None)
                continue
            batch = self._policy.next_batch(worker, now)
            if batch is None:
                return
            self._start(worker, GENERATE, [r.payload for r in batch.requests], batch)

    def _start(self, worker: str, kind: str, jobs: list[PromptJob], batch: Batch | None) -> None:
        self._idle.remove(worker)
        now = self._clock()
        for job in jobs:
            job.dispatched_s = now
            self._running_jobs[job.key] = job
        self.stats.batches[kind] += 1
        self.stats.last_batch_size[kind] = len(jobs)
        if self._on_batch is not None:
            self._on_batch(kind, len(jobs), self.snapshot())
        task = asyncio.ensure_future(self._run_batch(worker, kind, jobs, batch))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run_batch(self, worker: str, kind: str, jobs: list[PromptJob], batch: Batch | None) -> None:
        answered: set[int] = set()

        def on_deltas(deltas: list[tuple[int, str]]) -> None:
            now = self._clock()
            for row, text in deltas:
                job = jobs[row]
                if job.first_token_s is None:
                    job.first_token_s = now
                if job.on_delta is not None:
                    job.on_delta(text)

        def on_row_done(row: int, outcome: PromptOutcome, first_token_offset_s: float) -> None:
            answered.add(row)
            self._answer(jobs[row], outcome, first_token_offset_s)

        try:
            result = await self._backend.run(kind, jobs, on_deltas, on_row_done)
            if len(result.outcomes) != len(jobs):
                raise RuntimeError(f"worker answered {len(result.outcomes)} of {len(jobs)} prompts")
        except Exception as exc:
            logger.exception("%s batch of %d on %s failed", kind, len(jobs), worker)
            self.stats.failed_batches += 1
            message = f"model instance failed: {exc}"
            result = BatchResult([PromptOutcome.failed(message, task=j.prepared.task) for j in jobs])
        if batch is not None:
            self._report(worker, batch, result)
        offsets = result.first_token_s or [0.0] * len(jobs)
        for row, (job, outcome, offset) in enumerate(zip(jobs, result.outcomes, offsets, strict=True)):
            if row not in answered:
                self._answer(job, outcome, offset)
        self._idle.append(worker)
        self._wake.set()

    def _answer(self, job: PromptJob, outcome: PromptOutcome, first_token_offset_s: float) -> None:
        """Deliver one prompt's outcome: it has left its batch, its cancellation marker goes."""
        self._running_jobs.pop(job.key, None)
        if self._board is not None:
            self._board.clear(job.row_id)
        if job.first_token_s is None and job.dispatched_s is not None and first_token_offset_s > 0:
            job.first_token_s = job.dispatched_s + first_token_offset_s
        try:
            job.on_done(job.prepared.finish(outcome))
        except Exception:
            logger.exception("delivering the outcome of prompt %s failed", job.key)

    def _report(self, worker: str, batch: Batch, result: BatchResult) -> None:
        """Feed a measured batch back to the policy; a batch that measured nothing only frees the worker."""
        if result.seconds_per_token > 0:
            self._policy.on_batch_done(
                worker,
                batch,
                self._clock(),
                seconds_per_token=result.seconds_per_token,
                free_kv_tokens=result.free_kv_tokens,
                output_tokens=[o.num_output_tokens for o in result.outcomes],
            )
        else:
            self._policy.on_batch_failed(worker, batch, self._clock())
