"""How much longer a row runs once it has run past its predicted length.

Admission predicts when each running row ends (its start, prefill and predicted tokens at
the rows' pace), and from those ends when a queued prompt starts and how much slack a row
has. A row still running past its predicted end was under-predicted, and by how much is
what the length predictor's recent errors say: where lengths fall in a few classes (the
`memory` workload: prompts asking 96-192 tokens or 384, predicted 110 for many of the
384), a row that has outrun a prediction of 110 runs to 384, not one step more. Priced at
one step more, every overrunning row frees its slot and its memory at once in the
forecast, and prompts are admitted to wait for rows that run for seconds yet.
"""

from __future__ import annotations

import bisect
from collections import deque
from itertools import accumulate


class ResidualLengths:
    """The predictor's recent errors (actual minus predicted tokens) over the last
    ``window`` finished rows, and the mean residual they imply for a row that has run
    ``overrun`` tokens past its prediction."""

    def __init__(self, window: int = 512) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self._recent: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []
        self._suffix_sums: list[float] | None = None  # sums of _sorted[i:], rebuilt when read

    def add(self, error: float) -> None:
        """A row finished ``error`` tokens past (or, negative, short of) its prediction."""
        if len(self._recent) == self._recent.maxlen:
            oldest = self._recent[0]
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._recent.append(error)
        bisect.insort(self._sorted, error)
        self._suffix_sums = None

    def mean_residual(self, overrun: float) -> float | None:
        """Mean tokens the recent rows that ran more than ``overrun`` tokens past their
        predictions went on for beyond it; None when none of them ran that far."""
        first = bisect.bisect_right(self._sorted, overrun)
        beyond = len(self._sorted) - first
        if beyond == 0:
            return None
        if self._suffix_sums is None:
            self._suffix_sums = [*accumulate(reversed(self._sorted), initial=0.0)][::-1]
        return self._suffix_sums[first] / beyond - overrun
