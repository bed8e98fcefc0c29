"""One model instance's side of a batch: validate rows, run the engine, stream, measure.

A row the engine refuses (over the context, bad parameters) fails alone; the rest of
the batch runs. Rows that asked for streaming get their text as deltas after every
step; a row whose id is on the cancellation board leaves the batch at the next step.
Each result carries, per row, the seconds from batch start to its first token, and for
the batch the measured seconds per output token and the instance's free KV capacity,
which the scheduler's policy feeds on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specbatch.decoding import Engine, GenerationRequest, GenerationResult
from specbatch.serving.cancellation import CancelBoard
from specbatch.serving.chat import ChatFormat, model_prompt
from specbatch.serving.detokenize import IncrementalDetokenizer
from specbatch.serving.outcomes import PromptOutcome

logger = logging.getLogger(__name__)

MODES = ("speculative", "target_only", "draft_only", "score")

DeltaSink = Callable[[list[tuple[int, str]]], None]
RowDone = Callable[[int, PromptOutcome, float], None]


@dataclass(frozen=True)
class WorkItem:
    """One row of a worker batch as it arrives over BLS."""

    prompt: str
    max_tokens: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    continuations: tuple[str, ...] = ()
    row_id: str = ""
    stream: bool = False
    chat: ChatFormat | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class WorkerResult:
    outcomes: list[PromptOutcome]
    seconds_per_token: float
    free_kv_tokens: int
    first_token_s: list[float] = field(default_factory=list)

    def rows(self, start: int, stop: int) -> WorkerResult:
        """The result of rows [start, stop) with the batch's measurements."""
        return WorkerResult(
            self.outcomes[start:stop],
            self.seconds_per_token,
            self.free_kv_tokens,
            self.first_token_s[start:stop],
        )


class BatchWorker:
    """Runs scheduler batches on one engine (whose block pool enforces the KV budget)."""

    def __init__(self, engine: Engine, board: CancelBoard | None = None) -> None:
        self._engine = engine
        self._board = board

    @property
    def free_kv_tokens(self) -> int:
        return self._engine.snapshot().free_tokens

    def run(
        self,
        mode: str,
        items: Sequence[WorkItem],
        on_deltas: DeltaSink | None = None,
        on_row_done: RowDone | None = None,
    ) -> WorkerResult:
        """Serve one batch.

        `on_deltas([(row, text), ...])` is called once per step for streaming rows;
        `on_row_done(row, outcome, first_token_s)` as soon as a generated row finishes,
        after its last delta, so its answer need not wait for the batch's longest row.
        """
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: expected one of {', '.join(MODES)}")
        started = time.perf_counter()
        if mode == "score":
            outcomes = self._score(items)
            elapsed = time.perf_counter() - started
            return WorkerResult(outcomes, 0.0, self.free_kv_tokens, [elapsed] * len(items))
        outcomes, first_token_s = self._generate(mode, items, on_deltas, on_row_done, started)
        return WorkerResult(
            outcomes, self._engine.snapshot().seconds_per_token, self.free_kv_tokens, first_token_s
        )

    def _generate(
        self,
        mode: str,
        items: Sequence[WorkItem],
        on_deltas: DeltaSink | None,
        on_row_done: RowDone | None,
        started: float,
    ) -> tuple[list[PromptOutcome], list[float]]:
        outcomes: list[PromptOutcome | None] = [None] * len(items)
        first_token_s = [0.0] * len(items)
        rows: list[int] = []
        requests: list[GenerationRequest] = []
        for row, item in enumerate(items):
            try:
                request = GenerationRequest(
                    prompt=model_prompt(self._engine.pair.tokenizer, item.prompt, item.chat),
                    max_new_tokens=item.max_tokens,
                    temperature=item.temperature,
                    top_p=item.top_p,
                    top_k=item.top_k,
                    stop=item.stop,
                )
                self._engine.validate(request)
            except ValueError as exc:
                outcomes[row] = PromptOutcome.failed(str(exc))
                continue
            rows.append(row)
            requests.append(request)
        if not requests:
            return [o for o in outcomes if o is not None], first_token_s

        decode = self._engine.pair.tokenizer.decode
        streams = {
            i: IncrementalDetokenizer(lambda ids: decode(ids, skip_special_tokens=True), items[row].stop)
            for i, row in enumerate(rows)
            if items[row].stream and on_deltas is not None
        }

        def on_step(updates: dict[int, list[int]]) -> None:
            now = time.perf_counter() - started
            deltas = []
            for index, token_ids in updates.items():
                if first_token_s[rows[index]] == 0.0:
                    first_token_s[rows[index]] = now
                if index in streams:
                    text = streams[index].push(token_ids)
                    if text:
                        deltas.append((rows[index], text))
            if deltas and on_deltas is not None:
                on_deltas(deltas)

        def is_cancelled(index: int) -> bool:
            return self._board is not None and self._board.is_cancelled(items[rows[index]].row_id)

        def on_finished(index: int, result: GenerationResult) -> None:
            row = rows[index]
            outcomes[row] = _outcome(result)
            if index in streams and (rest := streams[index].finish(result.text)) and on_deltas is not None:
                on_deltas([(row, rest)])
            if on_row_done is not None:
                on_row_done(row, outcomes[row], first_token_s[row])

        self._engine.generate(
            requests, mode=mode, on_step=on_step, is_cancelled=is_cancelled, on_finished=on_finished
        )
        return [o for o in outcomes if o is not None], first_token_s

    def _score(self, items: Sequence[WorkItem]) -> list[PromptOutcome]:
        outcomes: list[PromptOutcome | None] = [None] * len(items)
        prompts: dict[int, str] = {}
        for row, item in enumerate(items):
            if not item.continuations:
                outcomes[row] = PromptOutcome.failed("a scoring row needs at least one choice")
                continue
            try:
                prompts[row] = model_prompt(self._engine.pair.tokenizer, item.prompt, item.chat)
            except ValueError as exc:
                outcomes[row] = PromptOutcome.failed(str(exc))
        rows = list(prompts)
        if rows:
            scores = self._engine.score_choices(
                [prompts[r] for r in rows], [list(items[r].continuations) for r in rows]
            )
            for row, score in zip(rows, scores, strict=True):
                outcomes[row] = PromptOutcome(text=score.best, finish_reason="stop")
        return [o for o in outcomes if o is not None]


def _outcome(result: GenerationResult) -> PromptOutcome:
    return PromptOutcome(
        text=result.text,
        finish_reason=result.finish_reason,
        num_input_tokens=result.num_input_tokens,
        num_output_tokens=result.num_output_tokens,
        total_draft_tokens=result.total_draft_tokens,
        total_accepted_draft_tokens=result.total_accepted_draft_tokens,
    )
