"""One FIFO queue per length bin: where the static policy keeps requests until a batch forms."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Hashable, Iterator

from specbatch.scheduling.requests import QueuedRequest


class BinQueues:
    """One FIFO queue per bin, with O(1) removal by id (cancel, expiry)."""

    def __init__(self, num_bins: int) -> None:
        self._queues: list[OrderedDict[Hashable, QueuedRequest]] = [OrderedDict() for _ in range(num_bins)]

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
