"""Length bins: where the edges between bins of predicted output length lie.

The admission policy files every queued prompt in a bin and reports the queue depth per
bin. The static batch-level policy (``specbatch.scheduling.static``) batches within a bin,
which pays because a static batch lasts as long as its longest member (Guldogan et al.
2024): similar predicted lengths together shrink the gap between a batch's mean and max.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence


def equally_spaced_cuts(num_bins: int, low: float, high: float) -> list[float]:
    """Interior cut points splitting [low, high] into ``num_bins`` bins of equal width."""
    width = (high - low) / num_bins
    return [low + width * i for i in range(1, num_bins)]


def equal_mass_cuts(values: Sequence[float], num_bins: int) -> list[float]:
    """Interior cut points at the i/k empirical quantiles of ``values``.

    With cuts at the quantiles each bin receives the same share of traffic, which the
    throughput analysis assumes (every bin forms batches at the same rate). Quantiles are
    the lower order statistics so the cuts are values actually seen.
    """
    if not values:
        raise ValueError("equal-mass boundaries need at least one observed prediction")
    ordered = sorted(values)
    n = len(ordered)
    return [ordered[min(n - 1, (i * n) // num_bins)] for i in range(1, num_bins)]


def equal_work_cuts(values: Sequence[float], parts: int) -> list[float]:
    """Interior cut points splitting ``values`` into ``parts`` ranges of about equal
    summed value: with predicted lengths, each range holds about the same share of
    decoding work (equal counts would put nearly all of it in the top range of a
    heavy-tailed mix). A cut is the lowest value of the range above it (a value actually
    seen), chosen so that the values below it sum nearest to its share; equal values
    stay in one range, so where a few long prompts share one prediction they form the
    top range alone."""
    if not values:
        raise ValueError("equal-work boundaries need at least one observed prediction")
    ordered = sorted(values)
    total = sum(ordered)
    distinct: list[float] = []
    below: list[float] = []  # per distinct value: the sum of the values less than it
    running = 0.0
    for value in ordered:
        if not distinct or value != distinct[-1]:
            distinct.append(value)
            below.append(running)
        running += value
    cuts = []
    for part in range(1, parts):
        share = total * part / parts
        cuts.append(distinct[min(range(len(distinct)), key=lambda j: abs(below[j] - share))])
    return cuts


class BinBoundaries:
    """Maps a predicted length to a bin index; equal-mass edges follow recent predictions.

    Edges change only every ``boundary_refresh_every`` observations, and a request keeps the
    bin it was given at submission, so refreshing never reorders a queue.
    """

    def __init__(
        self,
        num_bins: int,
        boundaries: str | tuple[float, ...] = "equal_mass",
        *,
        low: float = 1.0,
        high: float = 1024.0,
        window: int = 1000,
        refresh_every: int = 50,
        min_samples: int = 50,
    ) -> None:
        self._num_bins = num_bins
        self._adaptive = boundaries == "equal_mass"
        self._window: deque[float] = deque(maxlen=window)
        self._refresh_every = refresh_every
        self._min_samples = min_samples
        self._since_refresh = 0
        if isinstance(boundaries, tuple):
            self._cuts = list(boundaries)
        else:
            self._cuts = equally_spaced_cuts(num_bins, low, high)

    @property
    def cuts(self) -> list[float]:
        """Current interior cut points (ascending, ``num_bins - 1`` of them)."""
        return list(self._cuts)

    def observe(self, predicted_tokens: float) -> None:
        """Record a prediction; recompute equal-mass cuts when a refresh is due."""
        if not self._adaptive:
            return
        self._window.append(predicted_tokens)
        self._since_refresh += 1
        if self._since_refresh >= self._refresh_every and len(self._window) >= self._min_samples:
            self._cuts = equal_mass_cuts(self._window, self._num_bins)
            self._since_refresh = 0

    def assign(self, predicted_tokens: float) -> int:
        """Bin i holds predictions in [cut[i-1], cut[i]); the last bin is open above."""
        return bisect.bisect_right(self._cuts, predicted_tokens)
