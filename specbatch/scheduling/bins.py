"""The multi-bin layer: where bin edges lie, and one FIFO queue per bin.

Binning pays because a batch lasts as long as its longest member (Guldogan et al. 2024):
grouping similar predicted lengths shrinks the gap between the mean and the max of a batch.
"""

from __future__ import annotations

import bisect
import itertools
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterator, Sequence

from specbatch.scheduling.config import PolicyConfig
from specbatch.scheduling.requests import QueuedRequest


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

    @classmethod
    def from_config(cls, config: PolicyConfig) -> BinBoundaries:
        return cls(
            config.num_bins,
            config.boundaries,
            low=config.min_len,
            high=config.max_len,
            window=config.boundary_window,
            refresh_every=config.boundary_refresh_every,
            min_samples=config.boundary_min_samples,
        )

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


class BinQueues:
    """One FIFO queue per bin, with O(1) removal by id (cancel, expiry)."""

    def __init__(self, num_bins: int) -> None:
        self._queues: list[OrderedDict[Hashable, QueuedRequest]] = [OrderedDict() for _ in range(num_bins)]

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues)

    def depth(self, bin_index: int) -> int:
        return len(self._queues[bin_index])

    def depths(self) -> list[int]:
        return [len(q) for q in self._queues]

    def head(self, bin_index: int) -> QueuedRequest | None:
        queue = self._queues[bin_index]
        return next(iter(queue.values())) if queue else None

    def get(self, bin_index: int, request_id: Hashable) -> QueuedRequest:
        return self._queues[bin_index][request_id]

    def push(self, bin_index: int, request: QueuedRequest) -> None:
        self._queues[bin_index][request.request_id] = request

    def peek(self, bin_index: int, count: int) -> list[QueuedRequest]:
        """The first ``count`` requests of a bin, left in place (candidates for a batch)."""
        return list(itertools.islice(self._queues[bin_index].values(), count))

    def pop_front(self, bin_index: int, count: int) -> list[QueuedRequest]:
        queue = self._queues[bin_index]
        taken = []
        for _ in range(min(count, len(queue))):
            taken.append(queue.popitem(last=False)[1])
        return taken

    def remove(self, bin_index: int, request_id: Hashable) -> QueuedRequest | None:
        return self._queues[bin_index].pop(request_id, None)

    def nonempty(self) -> Iterator[int]:
        return (i for i, q in enumerate(self._queues) if q)
