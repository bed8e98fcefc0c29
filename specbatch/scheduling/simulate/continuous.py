"""A step-level simulator of continuous-batching instances under an admission policy.

Where the static policy's simulator (``specbatch.scheduling.static.simulate``) charges a
whole batch for its longest member, here a row costs a step: every instance runs steps
back to back while it has rows, each step lasting
``base + per_row × rows + per_context_slot × rows × the longest context among them +
per_prefill_token × prompt tokens started`` and giving every
running row one token (under speculation, the mean tokens a row commits per step at that
many rows). Rows join and leave at step boundaries. An instance holds rows as the
engine does: a row sent to it waits until its KV blocks fit (its context and a whole K's
tokens, beside a reserve of 1 % of the blocks while others run), in the order sent; and
where the running rows' next tokens do not fit, the most recently admitted row is
preempted, back to the front of the waiting rows, to prefill its prompt and every token
it had made again when it is readmitted. A policy that sends rows past the KV they need
(first-come batching) pays that recomputation, as it does live. After every step the
instance reports its load to the same `AdmissionPolicy` object the server runs, on a
virtual clock, and after every arrival and report the policy decides who starts where,
as the server's scheduler does (``admit_spread``); a row sent to a stepping instance
joins at its next boundary, and one decided on an instance's own report a step later
(:class:`ContinuousSimulator`). Where the policy's order changes with time alone (its
``next_wakeup_s``), it decides again then.

The server predicts a prompt's length when it arrives, with a predictor that learns from
the rows that ended before it; with ``lengths`` (making a fresh :class:`LengthModel` for
each run) the simulator asks it at each arrival and tells it of each row served, so that
predictions follow what the run has shown so far, as they do live. Without it each
request's ``predicted_tokens`` stands.

Steps of a live instance on a shared machine are not that regular: with ``step_cv`` each
step's duration is its cost times a lognormal factor of mean 1 and that coefficient of
variation (seeded), and the instance reports the seconds it took. Rows near the edge of
their SLA's pace miss it in the slow steps, which a simulator of exact costs never shows.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from specbatch.scheduling.admission import AdmissionPolicy, QueueFullError
from specbatch.scheduling.load import BatchStepCounter, InstanceLoad
from specbatch.scheduling.requests import QueuedRequest


@dataclass(frozen=True)
class StepCosts:
    """What a step costs, and what it gives each row: one token, or under speculation
    the tokens a row commits per step at that many rows (``tokens_per_row_step``: pairs of
    rows and mean tokens, interpolated between them; empty: one token). A committed token
    may carry a price of its own (``per_token_s``): a speculative step that commits more
    verified more, so a step's cost follows the K chosen at its batch size. Attention
    reads every row's KV padded to the step's longest context (``per_context_slot_s`` a
    slot of rows x that context): one long row makes a step of short ones dearer."""

    base_s: float = 0.02
    per_row_s: float = 0.002
    per_prefill_token_s: float = 0.00005
    tokens_per_row_step: tuple[tuple[float, float], ...] = ()
    per_token_s: float = 0.0
    per_context_slot_s: float = 0.0

    def step_s(self, rows: int, prefill_tokens: int, longest_context: int = 0) -> float:
        decode = rows * (self.per_row_s + self.per_token_s * self.tokens(rows))
        context = self.per_context_slot_s * rows * longest_context
        return self.base_s + decode + context + self.per_prefill_token_s * prefill_tokens

    def tokens(self, rows: int) -> float:
        """Tokens each of ``rows`` rows commits in one step."""
        if not self.tokens_per_row_step:
            return 1.0
        points = sorted(self.tokens_per_row_step)
        return float(np.interp(rows, [r for r, _ in points], [t for _, t in points]))


@dataclass(frozen=True)
class SimInstance:
    kv_tokens: int = 16384
    block_size: int = 16
    max_rows: int = 64


@dataclass(frozen=True)
class SimRequest:
    request_id: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    predicted_tokens: float
    deadline_s: float | None = None


class LengthModel(Protocol):
    """A run's length predictions as the server makes them: at each arrival, from what
    the rows served before it showed."""

    def predicted(self, request: SimRequest) -> float:
        """The tokens ``request`` is predicted to run, as it arrives."""
        ...

    def served(self, request: SimRequest) -> None:
        """``request``'s row ended, after all its ``output_tokens``."""
        ...


@dataclass
class SimOutcome:
    request: SimRequest
    status: str = "pending"  # served | rejected | shed
    first_token_s: float | None = None
    done_s: float | None = None
    instance: int | None = None
    preemptions: int = 0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.request.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.done_s is None else self.done_s - self.request.arrival_s


@dataclass
class _Row:
    outcome: SimOutcome
    queued: QueuedRequest
    generated: float = 0.0  # fractional under speculation: tokens per row-step are a mean


def _context(row: _Row) -> int:
    """The tokens a row's KV holds: its prompt and what it has made."""
    return row.queued.input_tokens + math.ceil(row.generated)


# The engine admits a row once its context and a whole K's tokens fit
# (decoding.lookahead.MAX_LOOKAHEAD), and keeps 1 % of the blocks free while rows run.
ADMISSION_LOOKAHEAD = 8
RESERVE_SHARE = 0.01


@dataclass
class _InstanceState:
    spec: SimInstance
    rows: list[_Row] = field(default_factory=list)
    joining: list[_Row] = field(default_factory=list)  # sent while it stepped: join at the next step
    waiting: list[_Row] = field(default_factory=list)  # sent, held until their KV blocks fit
    stepping: bool = False
    last_step_s: float = 0.0
    tokens_last_step: float = 1.0
    step_prefill: int = 0  # prompt tokens the step under way prefills
    step_slowdown: float = 1.0  # the step under way's duration over its cost
    counter: BatchStepCounter = field(default_factory=BatchStepCounter)

    def longest_context(self) -> int:
        """The longest context among the rows: every row's attention reads that many slots."""
        return max((_context(r) for r in self.rows), default=0)

    def held_blocks(self) -> int:
        return sum(self._blocks(_context(r)) for r in self.rows)

    def _blocks(self, tokens: int) -> int:
        return math.ceil(tokens / self.spec.block_size)

    def start_step(self) -> int:
        """Admit what fits, then make room for the running rows' next tokens; the
        tokens the step prefills (the context of every row it started)."""
        started = self._admit()
        self._make_room()
        return sum(_context(row) for row in started if row in self.rows)

    def _admit(self) -> list[_Row]:
        """Rows sent since the last step join the waiting ones; those that fit start, in
        order, and the first that does not holds the rest back (as the engine's queue
        does). A row that could never fit starts on an idle instance rather than wait
        for ever."""
        self.waiting.extend(self.joining)
        self.joining.clear()
        total = self.spec.kv_tokens // self.spec.block_size
        reserve = max(1, int(total * RESERVE_SHARE))
        started = []
        while self.waiting and len(self.rows) < self.spec.max_rows:
            need = self._blocks(_context(self.waiting[0]) + ADMISSION_LOOKAHEAD)
            if self.rows and need + reserve > total - self.held_blocks():
                break
            started.append(self.waiting.pop(0))
            self.rows.append(started[-1])
        return started

    def _make_room(self) -> None:
        """Preempt the most recently admitted rows until every running row's next token
        fits."""
        total = self.spec.kv_tokens // self.spec.block_size
        while len(self.rows) > 1 and sum(self._blocks(_context(r) + 1) for r in self.rows) > total:
            victim = self.rows.pop()
            victim.outcome.preemptions += 1
            self.waiting.insert(0, victim)

    def load(self) -> InstanceLoad:
        total = self.spec.kv_tokens // self.spec.block_size
        per_token = self.last_step_s / self.tokens_last_step
        return InstanceLoad(
            running=len(self.rows),
            waiting=len(self.joining) + len(self.waiting),
            blocks_total=total,
            blocks_free=max(0, total - self.held_blocks()),
            block_size=self.spec.block_size,
            step_seconds=self.last_step_s,
            seconds_per_token=per_token,
            batch_steps=self.counter.totals(),
            max_rows=self.spec.max_rows,
        )


class ContinuousSimulator:
    """Runs a list of requests through instances and a fresh policy from ``make_policy``.

    Decisions are taken as the live scheduler takes them: after every arrival and every
    step report, one ``admit_spread`` over all instances. A row sent to an idle instance
    starts at once; one sent to a stepping instance joins at its next step boundary. With
    ``lagged_dispatch`` (the live server's order), an instance reporting a step goes on
    with its next step before the decision on that report reaches it, so a row started in
    the place of one that just ended joins a step later: live, the scheduler hears of the
    end from another process while the engine steps on. Without it, the decision comes
    before the next step, as if the scheduler ran inside the engine's loop."""

    def __init__(
        self,
        make_policy: Callable[[], AdmissionPolicy],
        instances: Sequence[SimInstance] = (SimInstance(), SimInstance()),
        costs: StepCosts = StepCosts(),
        lagged_dispatch: bool = True,
        step_cv: float = 0.0,
        seed: int = 0,
        lengths: Callable[[], LengthModel] | None = None,
    ) -> None:
        if not math.isfinite(step_cv) or step_cv < 0:
            raise ValueError(f"step_cv must be a finite number >= 0, got {step_cv!r}")
        self._make_policy = make_policy
        self._instances = list(instances)
        self._costs = costs
        self._lagged_dispatch = lagged_dispatch
        self._step_cv = step_cv
        self._seed = seed
        self._lengths = lengths

    def _step_factors(self) -> Callable[[], float]:
        """Draws of each step's duration over its cost: 1 without ``step_cv``, else
        lognormal with mean 1 and that coefficient of variation, from ``seed`` each run."""
        if self._step_cv == 0:
            return lambda: 1.0
        sigma = math.sqrt(math.log1p(self._step_cv**2))
        rng = np.random.default_rng(self._seed)
        return lambda: float(rng.lognormal(-(sigma**2) / 2, sigma))

    def run(self, requests: Sequence[SimRequest]) -> list[SimOutcome]:
        policy = self._make_policy()
        lengths = self._lengths() if self._lengths is not None else None
        step_factor = self._step_factors()
        states = [_InstanceState(spec) for spec in self._instances]
        names = [f"instance{i}" for i in range(len(states))]
        index_of = {name: i for i, name in enumerate(names)}
        for name, state in zip(names, states, strict=True):
            policy.add_instance(name, state.load())
        outcomes = {r.request_id: SimOutcome(r) for r in requests}
        order = itertools.count()
        events: list[tuple[float, int, str, int]] = [
            (r.arrival_s, next(order), "arrive", r.request_id) for r in requests
        ]
        heapq.heapify(events)
        by_id = {r.request_id: r for r in requests}
        wakeups: set[float] = set()

        def begin_step(index: int, now: float) -> None:
            """The instance's next step, over its rows and those sent to it since its last."""
            state = states[index]
            state.step_prefill = state.start_step()
            state.stepping = bool(state.rows)
            if state.stepping:
                state.step_slowdown = step_factor()
                cost = self._costs.step_s(len(state.rows), state.step_prefill, state.longest_context())
                duration = cost * state.step_slowdown
                heapq.heappush(events, (now + duration, next(order), "step", index))

        def schedule(now: float) -> None:
            for outcome in _shed(policy, now, outcomes):
                outcome.status = "shed"
            for name, chosen in policy.admit_spread(now).items():
                index = index_of[name]
                state = states[index]
                for queued in chosen:
                    outcome = outcomes[queued.request_id]
                    outcome.instance = index
                    state.joining.append(_Row(outcome, queued))
                if not state.stepping:
                    begin_step(index, now)
            wake = policy.next_wakeup_s(now)  # e.g. a multibin bin's flush: no event brings it
            if wake is not None and wake not in wakeups and any(not s.stepping for s in states):
                wakeups.add(wake)
                heapq.heappush(events, (wake, next(order), "wake", -1))

        while events:
            now, _, kind, subject = heapq.heappop(events)
            if kind == "wake":
                wakeups.discard(now)
                schedule(now)
                continue
            if kind == "arrive":
                request = by_id[subject]
                predicted = request.predicted_tokens if lengths is None else lengths.predicted(request)
                queued = QueuedRequest(
                    request_id=request.request_id,
                    predicted_tokens=predicted,
                    input_tokens=request.input_tokens,
                    arrival_s=request.arrival_s,
                    deadline_s=request.deadline_s,
                )
                try:
                    policy.enqueue(queued)
                except QueueFullError:
                    outcomes[subject].status = "rejected"
                    continue
                schedule(now)
                continue
            state = states[subject]
            finished = []
            rows, longest = len(state.rows), state.longest_context()  # as the step began
            tokens = self._costs.tokens(rows)
            for row in state.rows:
                output_tokens = row.outcome.request.output_tokens
                row.generated = min(float(output_tokens), row.generated + tokens)
                if row.outcome.first_token_s is None:
                    row.outcome.first_token_s = now
                if row.generated >= output_tokens:
                    row.outcome.done_s = now
                    row.outcome.status = "served"
                    finished.append(row)
            state.last_step_s = self._costs.step_s(rows, 0, longest) * state.step_slowdown
            state.tokens_last_step = tokens
            seconds = self._costs.step_s(rows, state.step_prefill, longest) * state.step_slowdown
            state.counter.record(rows, round(tokens * rows), state.step_prefill, seconds, rows * longest)
            for row in finished:
                state.rows.remove(row)
                policy.finished(names[subject], row.queued, row.outcome.request.output_tokens)
                if lengths is not None:
                    lengths.served(row.outcome.request)
            policy.report(names[subject], state.load())
            if self._lagged_dispatch:
                begin_step(subject, now)
                schedule(now)
            else:
                state.stepping = False
                schedule(now)
                if not state.stepping:
                    begin_step(subject, now)
        for outcome in _shed(policy, math.inf, outcomes):
            outcome.status = "shed"
        return [outcomes[r.request_id] for r in requests]


def _shed(policy: AdmissionPolicy, now: float, outcomes: dict) -> list[SimOutcome]:
    return [outcomes[request.request_id] for request in policy.shed(now)]


def goodput(outcomes: Sequence[SimOutcome], ttft_sla_s: float, tpot_sla_s: float, span_s: float) -> float:
    """Requests per second served with TTFT and per-token time within the SLA."""
    met = 0
    for o in outcomes:
        if o.status != "served" or o.ttft_s is None or o.e2e_s is None:
            continue
        tokens = o.request.output_tokens
        tpot = (o.e2e_s - o.ttft_s) / (tokens - 1) if tokens > 1 else 0.0
        if o.ttft_s <= ttft_sla_s and tpot <= tpot_sla_s:
            met += 1
    return met / span_s
