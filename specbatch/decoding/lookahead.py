"""How many tokens the draft proposes per step (K).

A long lookahead pays when the draft is usually right and wastes target compute when
it is not, so K follows the acceptance rate measured over the last few steps:
above 0.75 K grows by 2, above 0.60 by 1, above 0.40 it stays, above 0.25 it shrinks
by 1, otherwise by 2; always within [1, 8].
"""

from __future__ import annotations

from collections import deque

MIN_LOOKAHEAD = 1
MAX_LOOKAHEAD = 8


def next_lookahead(current: int, acceptance: float) -> int:
    """The rolling-window rule applied once."""
    if acceptance > 0.75:
        step = 2
    elif acceptance > 0.60:
        step = 1
    elif acceptance > 0.40:
        step = 0
    elif acceptance > 0.25:
        step = -1
    else:
        step = -2
    return max(MIN_LOOKAHEAD, min(MAX_LOOKAHEAD, current + step))


class Lookahead:
    """Fixed K (``fixed`` given) or adaptive K over a rolling window of steps."""

    def __init__(self, fixed: int | None = None, initial: int = 4, window: int = 4) -> None:
        if fixed is not None and not MIN_LOOKAHEAD <= fixed <= MAX_LOOKAHEAD:
            raise ValueError(f"lookahead must be within [{MIN_LOOKAHEAD}, {MAX_LOOKAHEAD}], got {fixed}")
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.fixed = fixed
        self.k = fixed if fixed is not None else initial
        self._window: deque[tuple[int, int]] = deque(maxlen=window)

    @property
    def adaptive(self) -> bool:
        return self.fixed is None

    def record(self, drafted: int, accepted: int) -> None:
        """Feed one step's batch totals; adaptive K moves by the rule on the window's rate."""
        if drafted <= 0:
            return
        self._window.append((drafted, accepted))
        if self.fixed is not None:
            return
        total_drafted = sum(d for d, _ in self._window)
        total_accepted = sum(a for _, a in self._window)
        self.k = next_lookahead(self.k, total_accepted / total_drafted)
