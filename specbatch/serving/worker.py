"""One model instance's side of a batch: validate rows, run the engine, measure.

A row the engine refuses (over the context, bad parameters) fails alone; the rest of
the batch runs. Each result carries the instance's measured seconds per output token
and its free KV capacity, which the scheduler's policy feeds on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from specbatch.decoding import Engine, GenerationRequest
from specbatch.serving.outcomes import PromptOutcome

logger = logging.getLogger(__name__)

MODES = ("speculative", "target_only", "draft_only", "score")


@dataclass(frozen=True)
class WorkItem:
    """One row of a worker batch as it arrives over BLS."""

    prompt: str
    max_tokens: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    continuations: tuple[str, ...] = ()


@dataclass(frozen=True)
class WorkerResult:
    outcomes: list[PromptOutcome]
    seconds_per_token: float
    free_kv_tokens: int


class BatchWorker:
    """Runs scheduler batches on one engine within a KV memory budget."""

    def __init__(self, engine: Engine, memory_budget_bytes: int) -> None:
        self._engine = engine
        self._memory_budget_bytes = memory_budget_bytes

    @property
    def free_kv_tokens(self) -> int:
        return self._engine.free_kv_tokens(self._memory_budget_bytes)

    def run(self, mode: str, items: Sequence[WorkItem]) -> WorkerResult:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: expected one of {', '.join(MODES)}")
        if mode == "score":
            outcomes = self._score(items)
            return WorkerResult(outcomes, 0.0, self.free_kv_tokens)
        outcomes = self._generate(mode, items)
        return WorkerResult(outcomes, self._engine.last_step_seconds_per_token, self.free_kv_tokens)

    def _generate(self, mode: str, items: Sequence[WorkItem]) -> list[PromptOutcome]:
        outcomes: list[PromptOutcome | None] = [None] * len(items)
        valid_rows: list[int] = []
        requests: list[GenerationRequest] = []
        for row, item in enumerate(items):
            request = GenerationRequest(
                prompt=item.prompt,
                max_new_tokens=item.max_tokens,
                temperature=item.temperature,
                top_p=item.top_p,
                top_k=item.top_k,
            )
            try:
                self._engine.validate(request)
            except ValueError as exc:
                outcomes[row] = PromptOutcome.failed(str(exc))
                continue
            valid_rows.append(row)
            requests.append(request)
        if requests:
            for row, result in zip(valid_rows, self._engine.generate(requests, mode=mode), strict=True):
                outcomes[row] = PromptOutcome(
                    text=result.text,
                    finish_reason=result.finish_reason,
                    num_input_tokens=result.num_input_tokens,
                    num_output_tokens=result.num_output_tokens,
                    total_draft_tokens=result.total_draft_tokens,
                    total_accepted_draft_tokens=result.total_accepted_draft_tokens,
                )
        return [o for o in outcomes if o is not None]

    def _score(self, items: Sequence[WorkItem]) -> list[PromptOutcome]:
        outcomes: list[PromptOutcome | None] = [None] * len(items)
        rows = [row for row, item in enumerate(items) if item.continuations]
        for row, item in enumerate(items):
            if not item.continuations:
                outcomes[row] = PromptOutcome.failed("a scoring row needs at least one choice")
        if rows:
            scores = self._engine.score_choices(
                [items[r].prompt for r in rows], [list(items[r].continuations) for r in rows]
            )
            for row, score in zip(rows, scores, strict=True):
                outcomes[row] = PromptOutcome(text=score.best, finish_reason="stop", num_output_tokens=0)
        return [o for o in outcomes if o is not None]
