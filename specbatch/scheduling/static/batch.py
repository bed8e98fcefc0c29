"""The batch the static policy hands an idle worker."""

from __future__ import annotations

from dataclasses import dataclass

from specbatch.scheduling.requests import QueuedRequest


@dataclass
class Batch:
    """Requests that run together on one worker.

    ``target_size`` is the size the policy aimed for (min(b_mem, b_SLA) or the static B);
    ``size`` can be smaller when a flush window or the starvation guard dispatched a
    partly filled batch. ``b_mem``/``b_sla`` record the bounds in force when it was formed,
    for metrics and plots; None means that bound was not in use.
    """

    requests: list[QueuedRequest]
    bin_index: int
    batch_id: int
    formed_s: float
    target_size: int
    b_mem: int | None = None
    b_sla: int | None = None

    @property
    def size(self) -> int:
        return len(self.requests)

