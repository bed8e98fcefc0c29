"""An engine's steps counted per batch-size bucket (see
:class:`~specbatch.scheduling.load.BatchStepTotals` for why)."""

from __future__ import annotations

from specbatch.scheduling.load import STEP_BATCH_LABELS, BatchStepTotals, step_batch_bucket


class BatchStepCounter:
    """Counts each committing step into its bucket."""

    def __init__(self) -> None:
        size = len(STEP_BATCH_LABELS)
        self._steps = [0] * size
        self._row_steps = [0] * size
        self._tokens = [0] * size
        self._prefill = [0] * size
        self._seconds = [0.0] * size

    def record(self, rows: int, tokens: int, prefill_tokens: int, seconds: float) -> None:
        index = step_batch_bucket(rows)
        self._steps[index] += 1
        self._row_steps[index] += rows
        self._tokens[index] += tokens
        self._prefill[index] += prefill_tokens
        self._seconds[index] += seconds

    def totals(self) -> BatchStepTotals:
        return BatchStepTotals(
            tuple(self._steps),
            tuple(self._row_steps),
            tuple(self._tokens),
            tuple(self._prefill),
            tuple(self._seconds),
        )
