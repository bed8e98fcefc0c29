"""The two values that cross the policy boundary: a queued request and a dispatched batch."""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from specbatch.scheduling.errors import InvalidRequestError


@dataclass(frozen=True)
class QueuedRequest:
    """One prompt waiting to be batched.

    ``predicted_tokens`` decides the bin; it may be fractional (the simulator uses continuous
    lengths to match the theory). ``arrival_s`` and ``deadline_s`` are on the caller's clock,
    whichever clock that is: the policy only compares them with the ``now_s`` it is given.
    """

    request_id: Hashable
    predicted_tokens: float
    input_tokens: int
    arrival_s: float
    deadline_s: float | None = None
    payload: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not _is_finite_number(self.predicted_tokens) or self.predicted_tokens < 0:
            raise InvalidRequestError(
                f"request {self.request_id!r}: predicted_tokens must be a finite number >= 0, "
                f"got {self.predicted_tokens!r}"
            )
        valid_input = isinstance(self.input_tokens, int) and not isinstance(self.input_tokens, bool)
        if not valid_input or self.input_tokens < 0:
            raise InvalidRequestError(
                f"request {self.request_id!r}: input_tokens must be an int >= 0, got {self.input_tokens!r}"
            )
        if not _is_finite_number(self.arrival_s):
            raise InvalidRequestError(
                f"request {self.request_id!r}: arrival_s must be a finite number, got {self.arrival_s!r}"
            )
        if self.deadline_s is not None and not _is_finite_number(self.deadline_s):
            raise InvalidRequestError(
                f"request {self.request_id!r}: deadline_s must be a finite number or None, "
                f"got {self.deadline_s!r}"
            )


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

    @property
    def max_predicted_tokens(self) -> float:
        return max((r.predicted_tokens for r in self.requests), default=0)

    @property
    def total_input_tokens(self) -> int:
        return sum(r.input_tokens for r in self.requests)


def _is_finite_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
