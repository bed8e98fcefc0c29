"""Length-affine placement: which instance a prompt of a predicted length belongs on.

Under continuous batching every row of a step pays for the longest row's span (its
attention reads that many positions), so a prompt asking hundreds of tokens slows
every short row beside it for as long as it runs, and holds one of the instance's
rows all that time. With ``placement: length_affine`` the instances split the
predicted lengths between them: instance i of n (by name) is the home of the i-th of n
ranges with equal predicted work (each range's predicted tokens summed are the same
share of the recent prompts'), so short prompts run beside short ones and long beside
long, and each instance gets an even share of the decoding. A prompt spills over to
another instance when its home cannot start it now (no row b_SLA allows, or no memory):
affinity orders, it never leaves a prompt waiting beside an instance that could run it.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence

from specbatch.scheduling.bins import equal_work_cuts

PLACEMENTS = ("least_loaded", "length_affine")


class LengthAffinity:
    """Equal-work ranges of recent predicted lengths, one per instance, refreshed every
    ``refresh_every`` predictions once ``min_samples`` have been seen (before that no
    prompt has a home and placement is by load alone)."""

    def __init__(self, window: int = 1000, refresh_every: int = 50, min_samples: int = 50) -> None:
        self._window: deque[float] = deque(maxlen=window)
        self._refresh_every = refresh_every
        self._min_samples = min_samples
        self._since_refresh = 0
        self._cuts: dict[int, list[float]] = {}  # per number of instances

    def observe(self, predicted_tokens: float) -> None:
        """Record a prediction; the ranges are recomputed when a refresh is due."""
        self._window.append(predicted_tokens)
        self._since_refresh += 1
        if self._since_refresh >= self._refresh_every:
            self._cuts.clear()
            self._since_refresh = 0

    def home(self, predicted_tokens: float, names: Sequence[str]) -> str | None:
        """The instance (of ``names``) whose range holds ``predicted_tokens``; None with
        fewer than two instances or too few predictions seen."""
        if len(names) < 2 or len(self._window) < self._min_samples:
            return None
        parts = len(names)
        if parts not in self._cuts:
            self._cuts[parts] = equal_work_cuts(self._window, parts)
        return sorted(names)[bisect.bisect_right(self._cuts[parts], predicted_tokens)]
