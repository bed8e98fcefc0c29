"""A queued prompt: what the server's scheduler hands the admission policy.

The static batch-level policy (``specbatch.scheduling.static``) and both simulators queue
the same value, so a prompt means the same thing on every clock.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field

from specbatch.scheduling.errors import InvalidPolicyInputError


@dataclass(frozen=True)
class QueuedRequest:
    """One prompt waiting for an instance (admission) or for a batch (the static policy).

    ``predicted_tokens`` decides the bin; it may be fractional (the static simulator draws
    continuous lengths, as the multi-bin
    throughput theorem of Guldogan et al. 2024 assumes). ``arrival_s`` and ``deadline_s`` are on the
    caller's clock, whichever clock that is: the policy only compares them with the ``now_s``
    it is given. ``prefix_keys`` (:func:`specbatch.scheduling.prefixes.prefix_keys`) say
    which instance may hold the prompt's leading KV blocks.
    """

    request_id: Hashable
    predicted_tokens: float
    input_tokens: int
    arrival_s: float
    deadline_s: float | None = None
    prefix_keys: tuple[int, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if not _is_finite_number(self.predicted_tokens) or self.predicted_tokens < 0:
            raise InvalidPolicyInputError(
                f"request {self.request_id!r}: predicted_tokens must be a finite number >= 0, "
                f"got {self.predicted_tokens!r}"
            )
        valid_input = isinstance(self.input_tokens, int) and not isinstance(self.input_tokens, bool)
        if not valid_input or self.input_tokens < 0:
            raise InvalidPolicyInputError(
                f"request {self.request_id!r}: input_tokens must be an int >= 0, got {self.input_tokens!r}"
            )
        if not _is_finite_number(self.arrival_s):
            raise InvalidPolicyInputError(
                f"request {self.request_id!r}: arrival_s must be a finite number, got {self.arrival_s!r}"
            )
        if self.deadline_s is not None and not _is_finite_number(self.deadline_s):
            raise InvalidPolicyInputError(
                f"request {self.request_id!r}: deadline_s must be a finite number or None, "
                f"got {self.deadline_s!r}"
            )


def _is_finite_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
