"""One model instance's side of the scheduler connection: rows in, tokens and outcomes out.

The scheduler sends rows it admitted to this instance; each starts as a row of the
instance's continuous engine (or a prefill-only scoring row) the moment it arrives.
The engine calls back on its loop thread once per step — that is where the step's
streamed text, the rows that produced their first token and the instance's fresh
load go out in one message — and once per finished row. A row the engine refuses
(over the context, bad parameters) is answered at once with its error.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from specbatch import logprobs
from specbatch.decoding import Engine, GenerationRequest, GenerationResult
from specbatch.decoding.rows import RowHandle
from specbatch.decoding.scoring import ChoiceScores
from specbatch.scheduling.load import InstanceLoad
from specbatch.serving.faults import FaultHooks
from specbatch.serving.instance.detokenize import IncrementalDetokenizer
from specbatch.serving.messages import SCORE, Cancel, Done, Hello, Message, RowOutcome, RowWork, Run, Step
from specbatch.serving.params import PromptError

logger = logging.getLogger(__name__)

Send = Callable[[Message], None]


@dataclass
class _RunningRow:
    """What the runner holds for one row until its end."""

    handle: RowHandle | None = None  # None for a scoring row (it cannot be cancelled)
    stream: IncrementalDetokenizer | None = None
    started: bool = False
    logprobs_sent: int = 0  # of a streamed row's log-probabilities, how many went with deltas


class InstanceRunner:
    """Runs the rows the scheduler sends on one engine and reports back through ``send``."""

    def __init__(
        self,
        engine: Engine,
        name: str,
        send: Send,
        report_interval_s: float = 0.0,
        faults: FaultHooks | None = None,
    ) -> None:
        """Steps are reported at most every ``report_interval_s`` (their streamed text
        gathered), except that a row's first token and its end are reported at once."""
        self._engine = engine
        self._name = name
        self._send = send
        self._report_interval_s = report_interval_s
        self._faults = faults or FaultHooks()
        self._last_report = 0.0
        self._pending_deltas: list[tuple[int, str, str]] = []
        self._lock = threading.Lock()
        self._row_left = threading.Condition(self._lock)
        self._rows: dict[int, _RunningRow] = {}
        # each token's own text for the log-probabilities a row reports when it ends (on
        # the engine's loop thread: up to 21 per output token), remembered, so at most
        # one entry per token of the vocabulary
        self._token_text = functools.lru_cache(maxsize=None)(
            lambda token: engine.pair.tokenizer.decode([token])
        )
        engine.step_hook = lambda: self._faults.before_step(self._rows.keys())

    def load(self) -> InstanceLoad:
        """The engine's state; exact from the loop thread, one step old elsewhere."""
        if threading.current_thread() is self._engine.loop_thread:
            return self._engine.snapshot_now()
        return self._engine.snapshot()

    def hello(self, device: str) -> Hello:
        return Hello(instance=self._name, load=self.load(), pid=os.getpid(), device=device)

    def handle(self, message: Message) -> None:
        """A message from the scheduler: rows to run, or rows to cancel."""
        if isinstance(message, Run):
            for work in message.rows:
                self._start(work)
        elif isinstance(message, Cancel):
            with self._lock:
                handles = [row.handle for row in map(self._rows.get, message.rows) if row is not None]
            for handle in handles:
                if handle is not None:
                    self._engine.cancel(handle)
        else:
            logger.warning("%s: unexpected %s message from the scheduler", self._name, message.TYPE)

    def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the rows already here to finish; whether they did.

        Triton unloads an instance after its replacement is ready (a reload) or when the
        server stops; the scheduler sends a retiring connection nothing new, so the rows
        it runs can finish instead of being re-run or failed. If the scheduler goes away
        first, its rows are cancelled and end at the next step."""
        with self._row_left:
            return self._row_left.wait_for(lambda: not self._rows, timeout_s)

    def cancel_all(self) -> None:
        """The scheduler is gone: nobody waits for these rows any more."""
        with self._lock:
            handles = [row.handle for row in self._rows.values() if row.handle is not None]
        for handle in handles:
            self._engine.cancel(handle)

    # ---- rows -------------------------------------------------------------------------

    def _start(self, work: RowWork) -> None:
        self._faults.row_started(work.row, work.prompt)
        try:
            if work.kind == SCORE:
                if not work.choices:
                    raise PromptError("a scoring row needs at least one choice")
                with self._lock:
                    self._rows[work.row] = _RunningRow()
                self._engine.submit_scoring(
                    work.prompt,
                    work.choices,
                    lambda scores, error, row=work.row: self._scored(row, scores, error),
                )
                return
            deadline = None if work.seconds_left is None else time.monotonic() + work.seconds_left
            request = GenerationRequest(
                prompt=work.prompt,
                max_new_tokens=work.max_tokens,
                temperature=work.temperature,
                top_p=work.top_p,
                top_k=work.top_k,
                min_p=work.min_p,
                seed=work.random_seed,
                ignore_eos=work.ignore_eos,
                min_tokens=work.min_tokens,
                logprobs=work.logprobs,
                stop=work.stop,
                stop_token_ids=work.stop_token_ids,
                logit_bias=work.logit_bias,
                presence_penalty=work.presence_penalty,
                frequency_penalty=work.frequency_penalty,
                repetition_penalty=work.repetition_penalty,
                include_stop_str_in_output=work.include_stop_str_in_output,
                deadline=deadline,
            )
            with self._lock:
                row = self._rows[work.row] = _RunningRow()
                if work.stream:
                    decode = self._engine.pair.tokenizer.decode
                    row.stream = IncrementalDetokenizer(
                        lambda ids: decode(ids, skip_special_tokens=True), work.stop
                    )
                row.handle = self._engine.submit(request, self, key=work.row, mode=work.mode)
        except ValueError as exc:
            self._done(work.row, RowOutcome.failed(str(exc), reason="error"))
        except Exception as exc:
            logger.exception("%s: starting row %d failed", self._name, work.row)
            self._done(work.row, RowOutcome.failed(f"{self._name}: {exc}"))

    def on_tokens(self, updates: dict[int, list[int]]) -> None:
        """The engine's step: first tokens, streamed text and the load, in one message."""
        first = []
        with self._lock:
            for key, ids in updates.items():
                row = self._rows.get(key)
                if row is None:
                    continue
                if not row.started:
                    row.started = True
                    first.append(key)
                if row.stream is not None and (text := row.stream.push(ids)):
                    self._pending_deltas.append((key, text, self._unsent_logprobs(row)))
        now = time.monotonic()
        if first or now - self._last_report >= self._report_interval_s:
            self._report_step(first, now)

    def _report_step(self, first: list[int], now: float) -> None:
        with self._lock:
            deltas, self._pending_deltas = self._pending_deltas, []
        self._last_report = now
        self._send(Step(first=tuple(first), deltas=tuple(deltas), load=self.load()))

    def _unsent_logprobs(self, row: _RunningRow) -> str:
        """The JSON log-probabilities of the row's tokens that no delta carried yet ("" for
        a row that reports none): a delta carries those of the tokens pushed since the
        last one, including any whose text was held back then. If they cannot be written
        the delta goes without them, and the row's final report fails it."""
        reported = None if row.handle is None else row.handle.logprobs
        if reported is None:
            return ""
        try:
            text = logprobs.to_json(reported[row.logprobs_sent :], self._token_text)
        except Exception:
            logger.exception("%s: writing a delta's log-probabilities failed", self._name)
            return ""
        row.logprobs_sent = len(reported)
        return text

    def on_finished(self, key: int, result: GenerationResult) -> None:
        with self._lock:
            row = self._rows.get(key)
            sent = 0 if row is None else row.logprobs_sent
        try:
            outcome = _outcome(result, self._token_text, sent)
        except Exception as exc:  # the row still gets its one final answer
            logger.exception("%s: reporting row %d failed", self._name, key)
            outcome = RowOutcome.failed(f"{self._name}: reporting the row's result failed: {exc}")
        self._done(key, outcome)


    def _scored(self, row: int, scores: ChoiceScores | None, error: str) -> None:
        if scores is None:
            self._done(row, RowOutcome.failed(error, reason="error"))
        else:
            outcome = RowOutcome(text=scores.best, finish_reason="stop", num_input_tokens=scores.input_tokens)
            self._done(row, outcome)

    def _done(self, row: int, outcome: RowOutcome) -> None:
        """The row's end: forget it, send the text still waiting, then its outcome."""
        with self._lock:
            self._rows.pop(row, None)
            self._row_left.notify_all()
        self._faults.row_ended(row)
        if self._pending_deltas:
            self._report_step([], time.monotonic())
        self._send(Done(row=row, outcome=replace(outcome, instance=self._name), load=self.load()))


def _outcome(result: GenerationResult, token_text: Callable[[int], str], logprobs_sent: int) -> RowOutcome:
    """The row's outcome; a streamed row's log-probabilities are those no delta carried."""
    return RowOutcome(
        text=result.text,
        finish_reason=result.finish_reason,
        num_input_tokens=result.num_input_tokens,
        num_output_tokens=result.num_output_tokens,
        total_draft_tokens=result.total_draft_tokens,
        total_accepted_draft_tokens=result.total_accepted_draft_tokens,
        error=result.error,
        logprobs=(
            "" if result.logprobs is None else logprobs.to_json(result.logprobs[logprobs_sent:], token_text)
        ),
    )
