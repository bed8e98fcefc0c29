"""One model instance's side of the scheduler connection: rows in, tokens and outcomes out.

The scheduler sends rows it admitted to this instance; each becomes a row of the
instance's continuous engine (or a prefill-only scoring row) the moment it arrives.
The engine calls back on its loop thread once per step — that is where the step's
streamed text, the rows that produced their first token and the instance's fresh
load go out in one message — and once per finished row. A row the engine refuses
(over the context, bad parameters) is answered at once with its error.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from specbatch.decoding import Engine, GenerationRequest, GenerationResult
from specbatch.decoding.rows import RowHandle
from specbatch.decoding.scoring import ChoiceScores
from specbatch.scheduling.load import InstanceLoad
from specbatch.serving.chat import model_prompt
from specbatch.serving.faults import InjectedFault, marked
from specbatch.serving.instance.detokenize import IncrementalDetokenizer
from specbatch.serving.params import PromptError
from specbatch.serving.wire import (
    SCORE,
    RowOutcome,
    RowWork,
    load_to_dict,
    outcome_to_dict,
    work_from_dict,
)

logger = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], None]


class InstanceRunner:
    """Runs the rows the scheduler sends on one engine and reports back through ``send``."""

    def __init__(self, engine: Engine, name: str, send: Send, report_interval_s: float = 0.0) -> None:
        """Steps are reported at most every ``report_interval_s`` (their streamed text
        gathered), except that a row's first token and its end are reported at once."""
        self._engine = engine
        self._name = name
        self._send = send
        self._report_interval_s = report_interval_s
        self._last_report = 0.0
        self._pending_deltas: list[list] = []
        self._faulty: set[int] = set()
        self._hanging: set[int] = set()
        engine.step_hook = self._inject_fault
        self._lock = threading.Lock()
        self._row_left = threading.Condition(self._lock)
        self._handles: dict[int, RowHandle] = {}
        self._streams: dict[int, IncrementalDetokenizer] = {}
        self._started: set[int] = set()

    def load(self) -> InstanceLoad:
        """The engine's state; exact from the loop thread, one step old elsewhere."""
        return _load_of(self._engine, on_loop=threading.current_thread() is self._engine.loop_thread)

    def hello(self, device: str) -> dict[str, Any]:
        return {
            "type": "hello",
            "instance": self._name,
            "pid": os.getpid(),
            "device": device,
            "load": load_to_dict(self.load()),
        }

    def handle(self, message: dict[str, Any]) -> None:
        """A message from the scheduler: rows to run, or rows to cancel."""
        kind = message.get("type")
        if kind == "run":
            for data in message.get("rows", ()):
                self._start(work_from_dict(data))
        elif kind == "cancel":
            with self._lock:
                handles = [self._handles.get(int(row)) for row in message.get("rows", ())]
            for handle in handles:
                if handle is not None:
                    self._engine.cancel(handle)
        else:
            logger.warning("%s: unknown message %r from the scheduler", self._name, kind)

    def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the rows already here to finish; whether they did.

        Triton unloads an instance after its replacement is ready (a reload) or when the
        server stops; the scheduler sends a retiring connection nothing new, so the rows
        it runs can finish instead of being re-run or failed. If the scheduler goes away
        first, its rows are cancelled and end at the next step."""
        with self._row_left:
            return self._row_left.wait_for(lambda: not self._handles, timeout_s)

    def cancel_all(self) -> None:
        """The scheduler is gone: nobody waits for these rows any more."""
        with self._lock:
            handles = list(self._handles.values())
        for handle in handles:
            self._engine.cancel(handle)

    # ---- rows -------------------------------------------------------------------------

    def _inject_fault(self) -> None:
        if self._faulty and not self._faulty.isdisjoint(self._handles):
            raise InjectedFault(f"{self._name}: injected instance fault")
        if self._hanging and not self._hanging.isdisjoint(self._handles):
            logger.error("%s: injected hang", self._name)
            threading.Event().wait()

    def _start(self, work: RowWork) -> None:
        if marked(work.prompt, "instance"):
            self._faulty.add(work.row)
        if marked(work.prompt, "hang"):
            self._hanging.add(work.row)
        try:
            prompt = model_prompt(self._engine.pair.tokenizer, work.prompt, work.chat)
            if work.kind == SCORE:
                if not work.choices:
                    raise PromptError("a scoring row needs at least one choice")
                self._engine.submit_scoring(
                    prompt, work.choices, lambda scores, error, row=work.row: self._scored(row, scores, error)
                )
                return
            deadline = None if work.seconds_left is None else time.monotonic() + work.seconds_left
            request = GenerationRequest(
                prompt=prompt,
                max_new_tokens=work.max_tokens,
                temperature=work.temperature,
                top_p=work.top_p,
                top_k=work.top_k,
                stop=work.stop,
                deadline=deadline,
            )
            with self._lock:
                if work.stream:
                    decode = self._engine.pair.tokenizer.decode
                    self._streams[work.row] = IncrementalDetokenizer(
                        lambda ids: decode(ids, skip_special_tokens=True), work.stop
                    )
                self._handles[work.row] = self._engine.submit(request, self, key=work.row, mode=work.mode)
        except ValueError as exc:
            self._done(work.row, RowOutcome.failed(str(exc), reason="error"))
        except Exception as exc:
            logger.exception("%s: starting row %d failed", self._name, work.row)
            self._done(work.row, RowOutcome.failed(f"{self._name}: {exc}"))

    def on_tokens(self, updates: dict[int, list[int]]) -> None:
        """The engine's step: first tokens, streamed text and the load, in one message."""
        first = []
        with self._lock:
            for row, ids in updates.items():
                if row not in self._started:
                    self._started.add(row)
                    first.append(row)
                stream = self._streams.get(row)
                if stream is not None and (text := stream.push(ids)):
                    self._pending_deltas.append([row, text])
        now = time.monotonic()
        if first or now - self._last_report >= self._report_interval_s:
            self._report_step(first, now)

    def _report_step(self, first: list[int], now: float) -> None:
        with self._lock:
            deltas, self._pending_deltas = self._pending_deltas, []
        self._last_report = now
        self._send({"type": "step", "first": first, "deltas": deltas, "load": load_to_dict(self.load())})

    def on_finished(self, key: int, result: GenerationResult) -> None:
        self._done(key, _outcome(result))

    def _scored(self, row: int, scores: ChoiceScores | None, error: str) -> None:
        if scores is None:
            self._done(row, RowOutcome.failed(error, reason="error"))
        else:
            self._done(row, RowOutcome(text=scores.best, finish_reason="stop"))

    def _done(self, row: int, outcome: RowOutcome) -> None:
        """The row's end: forget it, send the text still waiting, then its outcome."""
        with self._lock:
            self._handles.pop(row, None)
            self._streams.pop(row, None)
            self._started.discard(row)
            self._faulty.discard(row)
            self._hanging.discard(row)
            self._row_left.notify_all()
        if self._pending_deltas:
            self._report_step([], time.monotonic())
        outcome = replace(outcome, instance=self._name)
        self._send(
            {
                "type": "done",
                "row": row,
                "outcome": outcome_to_dict(outcome),
                "load": load_to_dict(self.load()),
            }
        )


def _load_of(engine: Engine, on_loop: bool) -> InstanceLoad:
    snapshot = engine.snapshot_now() if on_loop else engine.snapshot()
    return InstanceLoad(
        running=snapshot.running,
        waiting=snapshot.waiting,
        blocks_total=snapshot.blocks_total,
        blocks_free=snapshot.blocks_free,
        block_size=snapshot.block_size,
        step_seconds=snapshot.step_seconds,
        seconds_per_token=snapshot.seconds_per_token,
        lookahead=snapshot.lookahead,
        preemptions=snapshot.preemptions,
        max_rows=engine.max_rows,
    )


def _outcome(result: GenerationResult) -> RowOutcome:
    return RowOutcome(
        text=result.text,
        finish_reason=result.finish_reason,
        num_input_tokens=result.num_input_tokens,
        num_output_tokens=result.num_output_tokens,
        total_draft_tokens=result.total_draft_tokens,
        total_accepted_draft_tokens=result.total_accepted_draft_tokens,
        error=result.error,
    )
