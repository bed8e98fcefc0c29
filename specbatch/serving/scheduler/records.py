"""One client request inside the scheduler, and the prompt jobs that point into it.

A request's prompts are routed, queued and run apart, and finish in any order. Its
`RequestState` holds what they share: the reply sink, arrival and deadline, each
prompt's streamed text, timing and outcome. A `PromptJob` is one prompt's place in
the queue or on an instance, and carries `(state, index)`; results are written
straight into the state, which sends the single final response when the last prompt
is settled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from specbatch.serving.latency import PromptTiming
from specbatch.serving.params import SamplingParams
from specbatch.serving.scheduler.tasks import PreparedPrompt
from specbatch.serving.wire import RowOutcome

logger = logging.getLogger(__name__)


class ReplySink(Protocol):
    """Where a request's responses go (a Triton response sender, or a test's recorder)."""

    def delta(self, index: int, task: str, text: str) -> None: ...

    def final(self, outcomes: list[RowOutcome]) -> None: ...

    def is_cancelled(self) -> bool: ...


Settled = Callable[["RequestState", list[RowOutcome], list[PromptTiming]], None]


class RequestState:
    """The prompts of one request, their streamed text, timings and outcomes."""

    def __init__(
        self,
        serial: int,
        count: int,
        reply: ReplySink,
        arrival_s: float,
        *,
        stream: bool = False,
        deadline_s: float | None = None,
        on_settled: Settled | None = None,
        stream_interval_s: float = 0.0,
    ) -> None:
        """With ``stream_interval_s`` > 0 a prompt's first text goes out at once and later
        text at most once per interval (pieces coalesced), since every response sent is
        a round trip to the server process; `flush` sends what waits."""
        if count <= 0:
            raise ValueError("a request needs at least one prompt")
        self.serial = serial
        self.reply = reply
        self.arrival_s = arrival_s
        self.stream = stream
        self.deadline_s = deadline_s
        self._on_settled = on_settled
        self.outcomes: list[RowOutcome | None] = [None] * count
        self.streamed = [""] * count
        self._unsent = [""] * count
        self._unsent_task = [""] * count
        self._last_sent: list[float | None] = [None] * count
        self._stream_interval_s = stream_interval_s
        self.dispatched_s: list[float | None] = [None] * count
        self.first_token_s: list[float | None] = [None] * count
        self.done_s: list[float] = [0.0] * count
        self._missing = count

    @property
    def done(self) -> bool:
        return self._missing == 0

    def stream_text(self, index: int, task: str, text: str, now_s: float = 0.0) -> None:
        if not (self.stream and text and self.outcomes[index] is None):
            return
        self.streamed[index] += text
        self._unsent[index] += text
        self._unsent_task[index] = task
        last = self._last_sent[index]
        if last is None or now_s - last >= self._stream_interval_s:
            self._send(index, now_s)

    def flush(self, now_s: float) -> None:
        """Send every prompt's text still waiting for its interval."""
        for index, text in enumerate(self._unsent):
            if text:
                self._send(index, now_s)

    def _send(self, index: int, now_s: float) -> None:
        text, self._unsent[index] = self._unsent[index], ""
        self._last_sent[index] = now_s
        self.reply.delta(index, self._unsent_task[index], text)

    def first_token(self, index: int, now_s: float) -> None:
        if self.first_token_s[index] is None:
            self.first_token_s[index] = now_s

    def settle(self, index: int, outcome: RowOutcome, now_s: float) -> bool:
        """Record prompt ``index``'s outcome (the first one wins); True when this completed
        the request, whose final response has then gone out."""
        if self.outcomes[index] is not None:
            return False
        if self.stream and outcome.text.startswith(self.streamed[index]):
            self.stream_text(index, outcome.task, outcome.text[len(self.streamed[index]) :], now_s)
        if self._unsent[index]:
            self._send(index, now_s)
        self.outcomes[index] = outcome
        self.done_s[index] = now_s
        self._missing -= 1
        if self._missing:
            return False
        outcomes = [o for o in self.outcomes if o is not None]
        if self._on_settled is not None:
            # Recorded before the answer goes out, so whoever reads the metrics after
            # receiving it sees this request counted.
            try:
                self._on_settled(self, outcomes, self.timings())
            except Exception:  # bookkeeping (metrics) must not keep the answer from going out
                logger.exception("recording the settled request %d failed", self.serial)
        self.reply.final(outcomes)
        return True

    def timings(self) -> list[PromptTiming]:
        return [
            PromptTiming(
                arrival_s=self.arrival_s,
                done_s=self.done_s[i],
                dispatched_s=self.dispatched_s[i],
                first_token_s=self.first_token_s[i],
                output_tokens=outcome.num_output_tokens if outcome is not None else 0,
            )
            for i, outcome in enumerate(self.outcomes)
        ]


@dataclass(eq=False)
class PromptJob:
    """One prompt of a request on its way through the scheduler."""

    state: RequestState
    index: int
    prepared: PreparedPrompt
    sampling: SamplingParams
    input_tokens: int = 0
    predicted_tokens: int = 1
    attempts: int = 0
    instance: str | None = None
    row: int | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.state.serial, self.index)

    @property
    def task(self) -> str:
        return self.prepared.task

    @property
    def streamed_anything(self) -> bool:
        return bool(self.state.streamed[self.index])

    def settle(self, outcome: RowOutcome, now_s: float) -> bool:
        """This prompt's answer (task named, mmlu letter formatted); see RequestState.settle."""
        return self.state.settle(self.index, self.prepared.finish(replace(outcome, task=self.task)), now_s)
