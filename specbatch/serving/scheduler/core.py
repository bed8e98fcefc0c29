"""The scheduler's core: requests in, rows out to addressed instances, answers back.

Everything here runs on the scheduler's one asyncio loop. A request is admitted
(or refused at once when the queue is full), its prompts become jobs: a graph is
solved in a worker process, a prompt the router could not place first runs a short
draft-model row whose answer picks its task, and mmlu and infobench prompts wait in
the admission policy's queue. Whenever an instance reports its load — on connecting,
after every step, with every finished row — the policy chooses which queued prompts
start there, and they go out on that instance's connection. Results come back on the
same connection and are written straight into the request's state.

A connection that closes is an instance that died: it gets no more work, and the
prompts it was running are re-queued when nothing of them reached the client yet
(once), or answered with an error. An instance that has rows but reports no step for
``hang_after_s`` is hung: it is taken out of service the same way and its process is
ended, so that it is restarted. A new connection under a name already connected (the
model was reloaded) takes the name's new work; the old connection retires: the rows
it runs finish there, and it gets nothing new.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from specbatch.routing import LengthPredictor, route_evidence
from specbatch.routing.classify import DEFAULT_TASK
from specbatch.scheduling import QueuedRequest
from specbatch.scheduling.admission import AdmissionPolicy, QueueFullError
from specbatch.scheduling.load import InstanceLoad
from specbatch.serving.faults import InjectedFault, marked
from specbatch.serving.latency import PromptTiming
from specbatch.serving.params import PromptError
from specbatch.serving.scheduler.intake import RequestIntake, RoutedRequest
from specbatch.serving.scheduler.state import PromptJob, ReplySink, RequestState
from specbatch.serving.scheduler.tasks import GENERATE, ROUTE, SCORE, SOLVE, parse_task, prepare_prompt
from specbatch.serving.wire import RowOutcome, RowWork, work_to_dict

logger = logging.getLogger(__name__)

SolveGraph = Callable[[str], Awaitable[str]]


class Overloaded(RuntimeError):
    """The queue cannot take this request; answer it with UNAVAILABLE now."""


class ShuttingDown(RuntimeError):
    """The server is stopping: no new work is admitted."""


class InstanceChannel(Protocol):
    """One instance connection; the core knows an instance by its connection, so a
    retired connection's late messages cannot be mistaken for its successor's."""

    def send(self, message: dict[str, Any]) -> None: ...

    def terminate(self) -> None:
        """Close the connection and end the instance's process (it is hung)."""


class SchedulerEvents:
    """What the core tells its observer (the Triton metrics); every method is optional."""

    def settled(self, outcomes: list[RowOutcome], timings: list[PromptTiming]) -> None: ...

    def rejected(self, prompts: int) -> None: ...

    def shed(self, prompts: int) -> None: ...

    def admitted(self, instance: str, prompts: int) -> None: ...

    def requeued(self, prompts: int) -> None: ...

    def instance_load(
        self, instance: str, load: InstanceLoad, rows_allowed: int, b_sla: int | None
    ) -> None: ...

    def instance_lost(self, instance: str) -> None: ...

    def instance_restarted(self, instance: str) -> None: ...

    def instances_serving(self, count: int) -> None: ...

    def restarted(self, error: str) -> None: ...

    def queue_depths(self, depths: list[int]) -> None: ...


@dataclass(frozen=True)
class CoreSettings:
    generation_mode: str = "speculative"
    fallback_tokens: int = 4
    max_attempts: int = 2
    hang_after_s: float = 60.0


@dataclass
class _Running:
    job: PromptJob
    queued: QueuedRequest
    instance: str
    channel: InstanceChannel


class SchedulerCore:
    def __init__(
        self,
        intake: RequestIntake,
        policy: AdmissionPolicy,
        solve_graph: SolveGraph,
        *,
        settings: CoreSettings | None = None,
        events: SchedulerEvents | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._intake = intake
        self._policy = policy
        self._solve_graph = solve_graph
        self._settings = settings or CoreSettings()
        self._events = events or SchedulerEvents()
        self._clock = clock
        self._channels: dict[str, InstanceChannel] = {}  # in service, by name
        self._names: dict[InstanceChannel, str] = {}  # every open connection (also retiring)
        self._progress_s: dict[InstanceChannel, float] = {}
        self._seen: set[str] = set()
        self._running: dict[int, _Running] = {}
        self._rows = itertools.count()
        self._active: dict[int, RequestState] = {}
        self._jobs_of: dict[int, list[PromptJob]] = {}
        self._predictor = LengthPredictor()
        self._background: set[asyncio.Task] = set()
        self._draining = False
        self._fault_pending = False

    # ---- requests ---------------------------------------------------------------------

    @property
    def queued(self) -> int:
        """Prompts waiting in the admission queue."""
        return self._policy.queued

    def admit(self, routed: RoutedRequest, reply: ReplySink) -> None:
        """Take a request: raises RequestError for malformed input and Overloaded when the
        queue cannot hold its prompts; otherwise every prompt is settled later."""
        if self._draining:
            raise ShuttingDown("the server is shutting down; retry on another replica")
        state, jobs, errors = self._intake.admit(routed, reply, self._settled)
        now = self._clock()
        queued = [self._queued_request(job) for job in jobs if job.prepared.kind != SOLVE]
        try:
            self._policy.submit_all(queued)
        except QueueFullError as exc:
            self._events.rejected(len(routed.prompts))
            raise Overloaded(str(exc)) from None
        if not state.done:
            self._active[state.serial] = state
            self._jobs_of[state.serial] = jobs
        for index, outcome in errors:
            state.settle(index, outcome, now)
        for job in jobs:
            if job.prepared.kind == SOLVE:
                self._spawn(self._solve(job))
            self._fault_pending |= marked(job.prepared.source, "scheduler")
        self._schedule_or_restart()

    def _queued_request(self, job: PromptJob) -> QueuedRequest:
        """The job as the policy queues it, with its predicted output length."""
        kind = job.prepared.kind
        if kind == GENERATE:
            predicted = self._predictor.predict(job.prepared.source, job.task)
            job.predicted_tokens = max(1, min(predicted, job.sampling.max_tokens))
        elif kind == ROUTE:
            job.predicted_tokens = self._settings.fallback_tokens
        else:
            job.predicted_tokens = 1
        return QueuedRequest(
            request_id=job.key,
            predicted_tokens=job.predicted_tokens,
            input_tokens=job.input_tokens,
            arrival_s=job.state.arrival_s,
            deadline_s=job.state.deadline_s,
            payload=job,
        )

    async def _solve(self, job: PromptJob) -> None:
        try:
            outcome = RowOutcome(text=await self._solve_graph(job.prepared.source), task=job.task)
        except PromptError as exc:
            outcome = RowOutcome.failed(str(exc), task=job.task)
        except Exception as exc:
            logger.exception("solving a graph prompt failed")
            outcome = RowOutcome.failed(f"graph solver failed: {exc}", task=job.task)
        self._settle(job, outcome)

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- instances --------------------------------------------------------------------

    def instance_joined(self, name: str, load: InstanceLoad, channel: InstanceChannel) -> None:
        previous = self._channels.pop(name, None)
        if previous is not None:
            self._policy.remove_instance(name)
            logger.warning("instance %s connected again; its old connection retires", name)
        elif name in self._seen:
            self._events.instance_restarted(name)
        self._seen.add(name)
        self._channels[name] = channel
        self._names[channel] = name
        self._progress_s[channel] = self._clock()
        self._policy.add_instance(name, load)
        logger.info("instance %s joined: %d KV blocks of %d tokens", name, load.blocks_total, load.block_size)
        self._events.instances_serving(len(self._channels))
        self._report(channel, load)
        self._schedule_or_restart()

    def instance_step(
        self,
        channel: InstanceChannel,
        first: Iterable[int],
        deltas: Iterable[tuple[int, str]],
        load: InstanceLoad,
    ) -> None:
        """An instance's step report: rows that produced their first token, streamed text."""
        now = self._clock()
        self._progress_s[channel] = now
        for row in first:
            running = self._running.get(row)
            if running is not None:
                running.job.state.first_token(running.job.index, now)
        for row, text in deltas:
            running = self._running.get(row)
            if running is not None:
                running.job.state.first_token(running.job.index, now)
                running.job.state.stream_text(running.job.index, running.job.task, text, now)
        self._report(channel, load)
        self._schedule_or_restart()

    def instance_done(
        self, channel: InstanceChannel, row: int, outcome: RowOutcome, load: InstanceLoad
    ) -> None:
        self._progress_s[channel] = self._clock()
        running = self._running.get(row)
        if running is not None and running.channel is channel:
            del self._running[row]
            self._policy.finished(running.instance, running.queued, outcome.num_output_tokens)
            try:
                self._finished_row(running.job, outcome)
            except Exception as exc:  # the prompt still gets its one answer
                logger.exception("handling the outcome of row %d failed", row)
                self._settle(running.job, RowOutcome.failed(f"the scheduler failed on this answer: {exc}"))
        self._report(channel, load)
        self._schedule_or_restart()

    def instance_lost(self, channel: InstanceChannel, reason: str) -> None:
        """The connection ended: if it was in service, take the instance out; settle or
        re-queue the prompts it was running."""
        name = self._names.pop(channel, None)
        self._progress_s.pop(channel, None)
        if name is None:
            return
        if self._channels.get(name) is channel:
            del self._channels[name]
            self._policy.remove_instance(name)
            self._events.instance_lost(name)
            self._events.instances_serving(len(self._channels))
            log = logger.info if self._draining else logger.error
            log("instance %s is out of service (%s)", name, reason)
        requeue: list[PromptJob] = []
        fail: list[PromptJob] = []
        for row, running in list(self._running.items()):
            if running.channel is not channel:
                continue
            del self._running[row]
            job = running.job
            if job.state.done or job.state.outcomes[job.index] is not None:
                continue
            wanted_again = not self._draining and not job.streamed_anything
            (requeue if wanted_again and job.attempts < self._settings.max_attempts else fail).append(job)
        if requeue:
            self._events.requeued(len(requeue))  # counted before any answer goes out
        for job in requeue:
            job.instance = job.row = None
            self._policy.requeue(self._queued_request(job))
        for job in fail:
            self._settle(job, RowOutcome.failed(f"model instance {name} failed while running this prompt"))
        self._schedule_or_restart()

    def check_hung(self) -> None:
        """Take out of service, and end, every instance that has rows but made no progress
        for ``hang_after_s`` (a stuck kernel, a deadlock): its prompts go elsewhere."""
        now = self._clock()
        busy = {running.channel for running in self._running.values()}
        for channel in busy:
            silent_s = now - self._progress_s.get(channel, now)
            if silent_s <= self._settings.hang_after_s:
                continue
            name = self._names.get(channel, "?")
            logger.error("instance %s made no progress for %.0f s: ending it", name, silent_s)
            self.instance_lost(channel, f"no progress for {silent_s:.0f} s")
            try:
                channel.terminate()
            except Exception:
                logger.exception("ending hung instance %s failed", name)

    def _report(self, channel: InstanceChannel, load: InstanceLoad) -> None:
        name = self._names.get(channel)
        if name is None or self._channels.get(name) is not channel:
            return  # a retiring connection's load is not its successor's
        self._policy.report(name, load)
        allowed, b_sla = self._policy.capacity(name)
        self._events.instance_load(name, load, allowed, b_sla)

    # ---- decisions --------------------------------------------------------------------

    def schedule(self) -> None:
        """Shed what cannot make its deadline, then start what each instance has room for."""
        if self._fault_pending:
            self._fault_pending = False
            raise InjectedFault("injected scheduler fault")
        now = self._clock()
        shed = self._policy.shed(now)
        if shed:
            self._events.shed(len(shed))  # counted before the answers go out
        for request in shed:
            job: PromptJob = request.payload
            self._settle(job, RowOutcome.failed("deadline exceeded", task=job.task, reason="cancelled"))
        started = self._policy.admit_spread(now)
        busy = {running.channel for running in self._running.values()} if started else set()
        for name, chosen in started.items():
            channel = self._channels[name]
            if channel not in busy:
                self._progress_s[channel] = now  # idle until now: silence counts from here
            rows = []
            for request in chosen:
                job = request.payload
                row = next(self._rows)
                job.instance, job.row = name, row
                job.attempts += 1
                job.state.dispatched_s[job.index] = now
                self._running[row] = _Running(job, request, name, channel)
                rows.append(work_to_dict(self._work(job, row, now)))
            channel.send({"type": "run", "rows": rows})
            self._events.admitted(name, len(rows))

    def report_queue(self) -> None:
        """Queue depth per bin to the observer (from the loop's tick, not per event)."""
        self._events.queue_depths(self._policy.depths())

    def _schedule_or_restart(self) -> None:
        """Schedule after an event; a failure answers everything held (see restart)."""
        try:
            self.schedule()
        except Exception as exc:
            self.restart(exc)

    def next_wakeup_s(self) -> float | None:
        return self._policy.next_wakeup_s(self._clock())

    def _work(self, job: PromptJob, row: int, now: float) -> RowWork:
        prepared, sampling = job.prepared, job.sampling
        seconds_left = None if job.state.deadline_s is None else max(0.0, job.state.deadline_s - now)
        if prepared.kind == SCORE:
            return RowWork(
                row=row,
                kind=SCORE,
                prompt=prepared.model_prompt,
                chat=prepared.chat,
                choices=prepared.continuations,
            )
        if prepared.kind == ROUTE:
            return RowWork(
                row=row,
                kind=GENERATE,
                prompt=prepared.model_prompt,
                mode="draft_only",
                max_tokens=self._settings.fallback_tokens,
                seconds_left=seconds_left,
            )
        return RowWork(
            row=row,
            kind=GENERATE,
            prompt=prepared.model_prompt,
            mode=self._settings.generation_mode,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            stop=sampling.stop,
            stream=sampling.stream,
            chat=prepared.chat,
            seconds_left=seconds_left,
        )

    def _finished_row(self, job: PromptJob, outcome: RowOutcome) -> None:
        if outcome.finish_reason == "deadline":
            outcome = replace(outcome, finish_reason="cancelled", error="deadline exceeded")
        elif outcome.finish_reason == "cancelled" and not outcome.error:
            outcome = replace(outcome, error="request cancelled")
        if job.prepared.kind == ROUTE and not outcome.error:
            self._route(job, outcome.text)
            return
        if job.prepared.kind == GENERATE and not outcome.error:
            self._predictor.observe(job.prepared.source, job.task, outcome.num_output_tokens)
        self._settle(job, outcome)

    def _route(self, job: PromptJob, draft_answer: str) -> None:
        """The draft model placed an ambiguous prompt: prepare it for that task and go on."""
        source = job.prepared.source
        evidence = route_evidence(source)
        task = parse_task(draft_answer)
        if task not in evidence.candidates:
            task = DEFAULT_TASK
        try:
            job.prepared = prepare_prompt(source, task, job.prepared.chat)
            job.input_tokens = self._intake.check_context(job.prepared, job.sampling.max_tokens)
        except PromptError as exc:
            self._settle(job, RowOutcome.failed(str(exc), task=task))
            return
        if job.prepared.kind == SOLVE:
            self._spawn(self._solve(job))
        else:
            job.attempts = 0
            self._policy.requeue(self._queued_request(job))

    def _settle(self, job: PromptJob, outcome: RowOutcome) -> None:
        job.settle(outcome, self._clock())

    def _settled(self, state: RequestState, outcomes: list[RowOutcome], timings: list[PromptTiming]) -> None:
        self._active.pop(state.serial, None)
        self._jobs_of.pop(state.serial, None)
        self._events.settled(outcomes, timings)

    # ---- cancellation and shutdown ----------------------------------------------------

    def flush_streams(self) -> None:
        """Send the streamed text that is waiting for its interval."""
        now = self._clock()
        for state in list(self._active.values()):
            if state.stream:
                state.flush(now)

    def poll_cancellations(self) -> None:
        """Withdraw the prompts of requests whose client cancelled: queued ones now, running
        ones at their instance's next step."""
        for serial, state in list(self._active.items()):
            if state.done or not state.reply.is_cancelled():
                continue
            rows: list[int] = []
            for job in self._jobs_of.get(serial, ()):
                if state.outcomes[job.index] is not None:
                    continue
                if self._policy.cancel(job.key) is not None or job.prepared.kind == SOLVE:
                    self._settle(
                        job, RowOutcome.failed("request cancelled", task=job.task, reason="cancelled")
                    )
                elif job.row is not None:
                    rows.append(job.row)
            self._cancel_rows(rows)

    @property
    def running_rows(self) -> int:
        return len(self._running)

    def begin_shutdown(self, message: str = "the server is shutting down") -> None:
        """Admit nothing more and answer every queued prompt; running rows may finish."""
        self._draining = True
        for serial in list(self._active):
            for job in self._jobs_of.get(serial, ()):
                if self._policy.cancel(job.key) is not None:
                    self._settle(job, RowOutcome.failed(message, task=job.task))

    def fail_everything(self, message: str) -> None:
        """Answer every prompt still held (shutdown, or the loop failing) with ``message``;
        rows running on instances are cancelled there and their reservations released."""
        for running in self._running.values():
            self._policy.finished(running.instance, running.queued, 0)
        self._cancel_rows(list(self._running))
        self._running.clear()
        for serial in list(self._active):
            for job in self._jobs_of.get(serial, ()):
                self._policy.cancel(job.key)
                self._settle(job, RowOutcome.failed(message, task=job.task))

    def restart(self, error: Exception) -> None:
        """After a failed scheduling step: answer everything held, keep the instances, go on."""
        logger.error(
            "the scheduler failed (%s); answering every pending prompt and going on", error, exc_info=error
        )
        self._fault_pending = False
        message = f"the scheduler failed while this prompt was pending ({error}); retry"
        self._events.restarted(message)  # counted before the answers go out
        self.fail_everything(message)

    def _cancel_rows(self, rows: list[int]) -> None:
        """Tell the connections running these rows to drop them at their next step."""
        by_channel: dict[InstanceChannel, list[int]] = {}
        for row in rows:
            running = self._running.get(row)
            if running is not None:
                by_channel.setdefault(running.channel, []).append(row)
        for channel, mine in by_channel.items():
            channel.send({"type": "cancel", "rows": mine})
