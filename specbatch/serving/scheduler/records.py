"""One client request inside the scheduler, and one record per prompt of it.

A request's prompts are routed, queued and run apart, and finish in any order. The
`RequestState` holds what they share (the reply sink, arrival, deadline, streaming)
and owns a `PromptRecord` per prompt: everything the scheduler knows of that prompt
from intake to its answer — what runs (the prepared prompt and its sampling), the
prediction and bin it was queued with, where it runs (instance, connection), its
attempts, timings, streamed text and outcome. A result is written straight into the
record; the request sends its single final response when its last record settles. A
self-refined prompt keeps its first answer here while its refining pass runs, and is
answered with the refined text and the counters of both passes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from specbatch.logprobs import join_json
from specbatch.scheduling.requests import QueuedRequest
from specbatch.serving.latency import PromptTiming
from specbatch.serving.messages import GENERATE, RowOutcome
from specbatch.serving.params import SamplingParams
from specbatch.serving.scheduler.tasks import PreparedPrompt
from specbatch.triton.outputs import COUNTERS

logger = logging.getLogger(__name__)


class ReplySink(Protocol):
    """Where a request's responses go (a Triton response sender, or a test's recorder)."""

    def delta(self, index: int, task: str, text: str, logprobs: str = "") -> None: ...

    def final(self, outcomes: list[RowOutcome]) -> None: ...

    def is_cancelled(self) -> bool: ...


Settled = Callable[["RequestState"], None]


@dataclass(eq=False)
class PromptRecord:
    """One prompt of a request, from intake to its answer."""

    request: RequestState
    index: int
    id: int  # unique in the scheduler: the prompt's key in the queue and its row on an instance
    task: str = ""
    prepared: PreparedPrompt | None = None
    sampling: SamplingParams | None = None
    model_text: str = ""  # exactly what the model continues (a chat prompt rendered)
    input_tokens: int = 0
    predicted_tokens: int = 1
    bin: int | None = None
    ticket: QueuedRequest | None = None  # the policy's view, while queued or running
    attempts: int = 0
    instance: str | None = None
    channel: Any = None  # the instance connection running it; None while not running
    dispatched_s: float | None = None
    first_token_s: float | None = None
    done_s: float = 0.0
    streamed: str = ""
    unsent: str = ""
    unsent_logprobs: list[str] = field(default_factory=list)  # JSON lists, one per piece of unsent
    last_sent_s: float | None = None
    outcome: RowOutcome | None = None
    self_refine: bool = False  # asked for: a generated answer gets a second, refining pass
    first_pass: RowOutcome | None = None  # the answer being refined, once its refining pass began

    @property
    def settled(self) -> bool:
        return self.outcome is not None

    @property
    def refines_next(self) -> bool:
        """The generation now due is a first pass: its answer is refined, not sent (nor streamed)."""
        return self.self_refine and self.first_pass is None and self.kind == GENERATE

    @property
    def kind(self) -> str:
        return "" if self.prepared is None else self.prepared.kind

    def first_token(self, now_s: float) -> None:
        if self.first_token_s is None:
            self.first_token_s = now_s

    def stream_text(self, text: str, now_s: float, logprobs: str = "") -> None:
        """Text the model produced, with the JSON log-probabilities of its tokens (""
        for none); with an interval, pieces are coalesced (see RequestState)."""
        if not (self.request.stream and text and self.outcome is None):
            return
        self.streamed += text
        self.unsent += text
        if logprobs:
            self.unsent_logprobs.append(logprobs)
        interval = self.request.stream_interval_s
        if self.last_sent_s is None or now_s - self.last_sent_s >= interval:
            self.send_unsent(now_s)

    def send_unsent(self, now_s: float) -> None:
        if not self.unsent:
            return
        text, self.unsent = self.unsent, ""
        pieces, self.unsent_logprobs = self.unsent_logprobs, []
        self.last_sent_s = now_s
        self.request.reply.delta(self.index, self.task, text, join_json(pieces))

    def settle(self, outcome: RowOutcome, now_s: float) -> bool:
        """This prompt's answer (task named, mmlu letter formatted; the first one wins);
        True when it completed the request, whose final response has then gone out."""
        if self.outcome is not None:
            return False
        outcome = as_answered(outcome if self.prepared is None else self.prepared.answer(outcome), self.task)
        if self.first_pass is not None:
            outcome = both_passes(self.first_pass, outcome)
        if self.request.stream and outcome.text.startswith(self.streamed):
            self.stream_text(outcome.text[len(self.streamed) :], now_s)
        self.send_unsent(now_s)
        self.outcome = outcome
        self.done_s = now_s
        self.channel = None
        return self.request.prompt_settled()

    def timing(self) -> PromptTiming:
        return PromptTiming(
            arrival_s=self.request.arrival_s,
            done_s=self.done_s,
            dispatched_s=self.dispatched_s,
            first_token_s=self.first_token_s,
            output_tokens=self.outcome.num_output_tokens if self.outcome is not None else 0,
        )


def as_answered(outcome: RowOutcome, task: str) -> RowOutcome:
    """A row's outcome as the client sees it: its task named, an instance's deadline
    stop reported as the cancellation it is, every cancellation with its reason."""
    reason, error = outcome.finish_reason, outcome.error
    if reason == "deadline":
        reason, error = "cancelled", "deadline exceeded"
    elif reason == "cancelled" and not error:
        error = "request cancelled"
    return replace(outcome, task=task, finish_reason=reason, error=error)


def both_passes(first: RowOutcome, refined: RowOutcome) -> RowOutcome:
    """A self-refined prompt's answer: the refining pass's, counting the tokens of both
    passes (what the prompt cost; the acceptance rate follows), and naming the instance of
    the first when the second never ran."""
    counters = {name: getattr(first, name) + getattr(refined, name) for name in COUNTERS}
    return replace(refined, instance=refined.instance or first.instance, **counters)


@dataclass(eq=False)
class RequestState:
    """One request: its reply sink, clock marks, and its prompts' records.

    With ``stream_interval_s`` > 0 a prompt's first text goes out at once and later text
    at most once per interval (pieces coalesced), since every response sent is a round
    trip to the server process; `flush` sends what waits.
    """

    reply: ReplySink
    arrival_s: float
    stream: bool = False
    deadline_s: float | None = None
    stream_interval_s: float = 0.0
    on_settled: Settled | None = None
    prompts: list[PromptRecord] = field(default_factory=list)
    _missing: int = 0

    def add_prompt(self, prompt_id: int, task: str) -> PromptRecord:
        record = PromptRecord(request=self, index=len(self.prompts), id=prompt_id, task=task)
        self.prompts.append(record)
        self._missing += 1
        return record

    @property
    def done(self) -> bool:
        return self._missing == 0

    @property
    def outcomes(self) -> list[RowOutcome | None]:
        return [record.outcome for record in self.prompts]

    def flush(self, now_s: float) -> None:
        """Send every prompt's text still waiting for its interval."""
        for record in self.prompts:
            record.send_unsent(now_s)

    def prompt_settled(self) -> bool:
        """Count one settled prompt; after the last, record the request and answer it."""
        self._missing -= 1
        if self._missing:
            return False
        if self.on_settled is not None:
            # Recorded before the answer goes out, so whoever reads the metrics after
            # receiving it sees this request counted.
            try:
                self.on_settled(self)
            except Exception:  # bookkeeping (metrics) must not keep the answer from going out
                logger.exception("recording a settled request failed")
        self.reply.final([record.outcome for record in self.prompts if record.outcome is not None])
        return True
