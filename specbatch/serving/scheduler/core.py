"""The scheduler's core: requests in, rows out to addressed instances, answers back.

Everything here runs on the scheduler's one asyncio loop. A request is submitted (or
refused at once when the queue is full) and each of its prompts gets one record
(`records.PromptRecord`), which the core keeps in one map by prompt id until it is
settled: a graph is solved in a worker process, a prompt the router could not place
first runs a short draft-model row whose answer picks its task, and mmlu and infobench
prompts are enqueued in the admission policy; a self-refined infobench prompt is queued
again after its first answer (not streamed), as the prompt refining it, and is answered
by that second row. Whenever an instance reports its load —
on connecting, after every step, with every finished row — the policy admits queued
prompts to it, and they start there as rows (a row's id is its prompt's id), sent on
that instance's connection. Results come back on the same connection and are written
straight into the record.

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
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from specbatch.routing import LengthPredictor, route_evidence
from specbatch.routing.classify import DEFAULT_TASK
from specbatch.scheduling.admission import AdmissionPolicy, InstanceCapacity, QueueFullError
from specbatch.scheduling.load import InstanceLoad
from specbatch.scheduling.prefixes import prefix_keys
from specbatch.scheduling.requests import QueuedRequest
from specbatch.serving.faults import FaultHooks
from specbatch.serving.latency import PromptTiming
from specbatch.serving.messages import Cancel, Message, RowOutcome, RowWork, Run
from specbatch.serving.params import PromptError
from specbatch.serving.scheduler.intake import RequestIntake, RoutedRequest
from specbatch.serving.scheduler.records import PromptRecord, ReplySink, RequestState
from specbatch.serving.scheduler.tasks import GENERATE, ROUTE, SCORE, SOLVE, parse_task

logger = logging.getLogger(__name__)

SolveGraph = Callable[[str], Awaitable[str]]


class Overloaded(RuntimeError):
    """The queue cannot take this request; answer it with UNAVAILABLE now."""


class ShuttingDown(RuntimeError):
    """The server is stopping: no new work is admitted."""


class InstanceChannel(Protocol):
    """One instance connection; the core knows an instance by its connection, so a
    retired connection's late messages cannot be mistaken for its successor's."""

    def send(self, message: Message) -> None: ...

    def terminate(self) -> None:
        """Close the connection and end the instance's process (it is hung)."""


class SchedulerEvents:
    """What the core tells its observer (the Triton metrics); every method is optional."""

    def settled(self, outcomes: list[RowOutcome], timings: list[PromptTiming]) -> None: ...

    def rejected(self, prompts: int) -> None: ...

    def shed(self, prompts: int) -> None: ...

    def admitted(self, instance: str, prompts: int) -> None: ...

    def requeued(self, prompts: int) -> None: ...

    def instance_load(self, instance: str, load: InstanceLoad, capacity: InstanceCapacity) -> None: ...

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
    cut_rows: str = "lower_bounds"  # how the length predictor learns a row cut short


class SchedulerCore:
    def __init__(
        self,
        intake: RequestIntake,
        policy: AdmissionPolicy,
        solve_graph: SolveGraph,
        *,
        settings: CoreSettings | None = None,
        events: SchedulerEvents | None = None,
        faults: FaultHooks | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._intake = intake
        self._policy = policy
        self._solve_graph = solve_graph
        self._settings = settings or CoreSettings()
        self._events = events or SchedulerEvents()
        self._faults = faults or FaultHooks()
        self._clock = clock
        self._channels: dict[str, InstanceChannel] = {}  # in service, by name
        self._names: dict[InstanceChannel, str] = {}  # every open connection (also retiring)
        self._progress_s: dict[InstanceChannel, float] = {}
        self._seen: set[str] = set()
        self._prompts: dict[int, PromptRecord] = {}  # every prompt not yet settled, by id
        self._running = 0
        self._predictor = LengthPredictor(cut_rows=self._settings.cut_rows)
        self._background: set[asyncio.Task] = set()
        self._draining = False

    # ---- requests ---------------------------------------------------------------------

    @property
    def queued(self) -> int:
        """Prompts waiting in the admission queue."""
        return self._policy.queued

    @property
    def running_rows(self) -> int:
        return self._running

    @property
    def held(self) -> int:
        """Prompts held until their answer (queued, being prepared or solved, running):
        every way a prompt ends lets go of it, so an idle scheduler holds none."""
        return len(self._prompts)

    def submit(self, routed: RoutedRequest, reply: ReplySink) -> None:
        """Take a request: raises RequestError for malformed input and Overloaded when the
        queue cannot hold its prompts; otherwise every prompt is settled later."""
        if self._draining:
            raise ShuttingDown("the server is shutting down; retry on another replica")
        state, failures = self._intake.receive(routed, reply, self._request_settled)
        failed = {id(record) for record, _ in failures}
        records = [record for record in state.prompts if id(record) not in failed]
        tickets = [self._ticket(record) for record in records if record.kind != SOLVE]
        try:
            self._policy.enqueue_all(tickets)
        except QueueFullError as exc:
            self._events.rejected(len(state.prompts))
            raise Overloaded(str(exc)) from None
        self._faults.request_arrived(reply, [str(p) for p in routed.prompts])
        for record in records:
            self._prompts[record.id] = record
            record.bin = self._policy.bin_of(record.id)
        now = self._clock()
        for record, outcome in failures:
            record.settle(outcome, now)
        for record in records:
            if record.kind == SOLVE:
                self._spawn(self._solve(record))
        self._schedule_or_restart()

    def _ticket(self, record: PromptRecord) -> QueuedRequest:
        """The prompt as the policy queues it, with its predicted output length."""
        assert record.prepared is not None and record.sampling is not None
        if record.kind == GENERATE and record.sampling.ignore_eos:
            record.predicted_tokens = record.sampling.max_tokens  # no end-of-sequence ends it sooner
        elif record.kind == GENERATE:
            predicted = self._predictor.predict(record.prepared.source, record.task)
            least = max(1, record.sampling.min_tokens)  # nothing ends it sooner
            record.predicted_tokens = max(least, min(predicted, record.sampling.max_tokens))
        elif record.kind == ROUTE:
            record.predicted_tokens = self._settings.fallback_tokens
        else:
            record.predicted_tokens = 1
        record.ticket = QueuedRequest(
            request_id=record.id,
            predicted_tokens=record.predicted_tokens,
            input_tokens=record.input_tokens,
            arrival_s=record.request.arrival_s,
            deadline_s=record.request.deadline_s,
            prefix_keys=prefix_keys(record.model_text),
        )
        return record.ticket

    def _requeue(self, record: PromptRecord) -> None:
        self._policy.requeue(self._ticket(record))
        record.bin = self._policy.bin_of(record.id)

    async def _solve(self, record: PromptRecord) -> None:
        try:
            outcome = RowOutcome(text=await self._solve_graph(record.prepared.source))
        except PromptError as exc:
            outcome = RowOutcome.failed(str(exc))
        except Exception as exc:
            logger.exception("solving a graph prompt failed")
            outcome = RowOutcome.failed(f"graph solver failed: {exc}")
        self._settle(record, outcome)

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
        deltas: Iterable[tuple[int, str, str]],
        load: InstanceLoad,
    ) -> None:
        """An instance's step report: rows that produced their first token, streamed text
        (each piece with the JSON log-probabilities of its tokens, "" for none)."""
        now = self._clock()
        self._progress_s[channel] = now
        for row in first:
            record = self._running_on(channel, row)
            if record is not None:
                record.first_token(now)
        for row, text, logprobs in deltas:
            record = self._running_on(channel, row)
            if record is not None:
                record.first_token(now)
                record.stream_text(text, now, logprobs)
        self._report(channel, load)
        self._schedule_or_restart()

    def instance_done(
        self, channel: InstanceChannel, row: int, outcome: RowOutcome, load: InstanceLoad
    ) -> None:
        self._progress_s[channel] = self._clock()
        record = self._running_on(channel, row)
        if record is not None:
            self._stopped_running(record, outcome.num_output_tokens)
            try:
                self._finished_row(record, outcome)
            except Exception as exc:  # the prompt still gets its one answer
                logger.exception("handling the outcome of row %d failed", row)
                self._settle(record, RowOutcome.failed(f"the scheduler failed on this answer: {exc}"))
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
        requeue: list[PromptRecord] = []
        fail: list[PromptRecord] = []
        for record in [r for r in self._prompts.values() if r.channel is channel]:
            self._stopped_running(record, 0)
            wanted_again = not self._draining and not record.streamed
            retry = wanted_again and record.attempts < self._settings.max_attempts
            (requeue if retry else fail).append(record)
        if requeue:
            self._events.requeued(len(requeue))  # counted before any answer goes out
        for record in requeue:
            record.instance = None
            self._requeue(record)
        for record in fail:
            self._settle(record, RowOutcome.failed(f"model instance {name} failed while running this prompt"))
        self._schedule_or_restart()

    def check_hung(self) -> None:
        """Take out of service, and end, every instance that has rows but made no progress
        for ``hang_after_s`` (a stuck kernel, a deadlock): its prompts go elsewhere."""
        now = self._clock()
        busy = {record.channel for record in self._prompts.values() if record.channel is not None}
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

    def _running_on(self, channel: InstanceChannel, row: int) -> PromptRecord | None:
        """The prompt running as ``row`` on ``channel`` (a retired or lost connection's late
        messages find nothing)."""
        record = self._prompts.get(row)
        return record if record is not None and record.channel is channel else None

    def _stopped_running(self, record: PromptRecord, output_tokens: int) -> None:
        """The row left its instance: release what the policy reserved for it."""
        self._policy.finished(record.instance, record.ticket, output_tokens)
        record.channel = None
        self._running -= 1

    def _report(self, channel: InstanceChannel, load: InstanceLoad) -> None:
        name = self._names.get(channel)
        if name is None or self._channels.get(name) is not channel:
            return  # a retiring connection's load is not its successor's
        self._policy.report(name, load)
        self._events.instance_load(name, load, self._policy.capacity(name))

    # ---- decisions --------------------------------------------------------------------

    def schedule(self) -> None:
        """Shed what cannot make its deadline, then start what each instance has room for."""
        self._faults.before_schedule()
        now = self._clock()
        shed = self._policy.shed(now)
        if shed:
            self._events.shed(len(shed))  # counted before the answers go out
        for ticket in shed:
            record = self._prompts[ticket.request_id]
            self._settle(record, RowOutcome.failed("deadline exceeded", reason="cancelled"))
        admitted = self._policy.admit_spread(now)
        busy = {record.channel for record in self._prompts.values()} if admitted else set()
        for name, tickets in admitted.items():
            channel = self._channels[name]
            if channel not in busy:
                self._progress_s[channel] = now  # idle until now: silence counts from here
            rows = tuple(self._start(self._prompts[t.request_id], name, channel, now) for t in tickets)
            channel.send(Run(rows))
            self._events.admitted(name, len(rows))

    def _start(self, record: PromptRecord, name: str, channel: InstanceChannel, now: float) -> RowWork:
        """The record as a row on instance ``name``; its id is the row's id there."""
        record.instance, record.channel = name, channel
        record.attempts += 1
        record.dispatched_s = now
        self._running += 1
        return self._work(record, now)

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

    def _work(self, record: PromptRecord, now: float) -> RowWork:
        prepared, sampling = record.prepared, record.sampling
        deadline_s = record.request.deadline_s
        seconds_left = None if deadline_s is None else max(0.0, deadline_s - now)
        if prepared.kind == SCORE:
            return RowWork(
                row=record.id, kind=SCORE, prompt=record.model_text, choices=prepared.continuations
            )
        if prepared.kind == ROUTE:
            return RowWork(
                row=record.id,
                kind=GENERATE,
                prompt=record.model_text,
                mode="draft_only",
                max_tokens=self._settings.fallback_tokens,
                seconds_left=seconds_left,
            )
        return RowWork(
            row=record.id,
            kind=GENERATE,
            prompt=record.model_text,
            mode=self._settings.generation_mode,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            random_seed=sampling.random_seed,
            ignore_eos=sampling.ignore_eos,
            min_tokens=sampling.min_tokens,
            logprobs=None if record.refines_next else sampling.logprobs,  # the refined answer's
            stop=sampling.stop,
            stop_token_ids=sampling.stop_token_ids,
            logit_bias=sampling.logit_bias,
            presence_penalty=sampling.presence_penalty,
            frequency_penalty=sampling.frequency_penalty,
            repetition_penalty=sampling.repetition_penalty,
            stream=sampling.stream and not record.refines_next,  # a first answer is not the answer
            seconds_left=seconds_left,
            include_stop_str_in_output=sampling.include_stop_str_in_output,
        )

    def _finished_row(self, record: PromptRecord, outcome: RowOutcome) -> None:
        ended_early = outcome.error or outcome.finish_reason in ("deadline", "cancelled")
        if record.kind == ROUTE and not ended_early:
            self._route(record, outcome.text)
            return
        if record.kind == GENERATE and not outcome.error:
            self._predictor.observe(
                record.prepared.source, record.task, outcome.num_output_tokens, cut=outcome.cut_short
            )
        if record.refines_next and not ended_early:
            self._next_stage(record, lambda: self._intake.refine(record, outcome))
            return
        self._settle(record, outcome)

    def _route(self, record: PromptRecord, draft_answer: str) -> None:
        """The draft model placed an ambiguous prompt: prepare it for that task and go on."""
        source = record.prepared.source
        task = parse_task(draft_answer)
        if task not in route_evidence(source).candidates:
            task = DEFAULT_TASK
        record.task = task  # named in the answer even if the prompt fails for it
        self._next_stage(record, lambda: self._intake.prepare(record, source, task, record.prepared.chat))

    def _next_stage(self, record: PromptRecord, prepare: Callable[[], None]) -> None:
        """A two-stage prompt's first row is done: ``prepare`` readies the record for its next
        stage, which starts like a new prompt (admitted by the policy, its attempts afresh);
        a prompt that stage refuses (PromptError) is answered with why."""
        try:
            prepare()
        except PromptError as exc:
            self._settle(record, RowOutcome.failed(str(exc)))
            return
        if record.kind == SOLVE:
            self._spawn(self._solve(record))
        else:
            record.attempts = 0
            self._requeue(record)

    def _settle(self, record: PromptRecord, outcome: RowOutcome) -> None:
        self._prompts.pop(record.id, None)
        record.settle(outcome, self._clock())

    def _request_settled(self, state: RequestState) -> None:
        outcomes = [record.outcome for record in state.prompts]
        self._events.settled(outcomes, [record.timing() for record in state.prompts])

    # ---- cancellation and shutdown ----------------------------------------------------

    def flush_streams(self) -> None:
        """Send the streamed text that is waiting for its interval."""
        now = self._clock()
        for record in list(self._prompts.values()):
            if record.request.stream:
                record.send_unsent(now)

    def poll_cancellations(self) -> None:
        """Withdraw the prompts of requests whose client cancelled: queued ones now, running
        ones at their instance's next step."""
        asked: dict[int, bool] = {}
        cancel: list[PromptRecord] = []
        for record in list(self._prompts.values()):
            request = id(record.request)
            if request not in asked:
                asked[request] = record.request.reply.is_cancelled()
            if not asked[request]:
                continue
            if self._policy.cancel(record.id) is not None or record.kind == SOLVE:
                self._settle(record, RowOutcome.failed("request cancelled", reason="cancelled"))
            elif record.channel is not None:
                cancel.append(record)
        self._cancel_rows(cancel)

    def begin_shutdown(self, message: str = "the server is shutting down") -> None:
        """Admit nothing more and answer every queued prompt; running rows may finish."""
        self._draining = True
        for record in list(self._prompts.values()):
            if self._policy.cancel(record.id) is not None:
                self._settle(record, RowOutcome.failed(message))

    def fail_everything(self, message: str) -> None:
        """Answer every prompt still held (shutdown, or the loop failing) with ``message``;
        rows running on instances are cancelled there and their reservations released."""
        running = [record for record in self._prompts.values() if record.channel is not None]
        self._cancel_rows(running)
        for record in running:
            self._stopped_running(record, 0)
        for record in list(self._prompts.values()):
            self._policy.cancel(record.id)
            self._settle(record, RowOutcome.failed(message))

    def restart(self, error: Exception) -> None:
        """After a failed scheduling step: answer everything held, keep the instances, go on."""
        logger.error(
            "the scheduler failed (%s); answering every pending prompt and going on", error, exc_info=error
        )
        message = f"the scheduler failed while this prompt was pending ({error}); retry"
        self._events.restarted(message)  # counted before the answers go out
        self.fail_everything(message)

    def _cancel_rows(self, records: list[PromptRecord]) -> None:
        """Tell the connections running these prompts to drop them at their next step."""
        by_channel: dict[InstanceChannel, list[int]] = {}
        for record in records:
            by_channel.setdefault(record.channel, []).append(record.id)
        for channel, rows in by_channel.items():
            channel.send(Cancel(tuple(rows)))
