"""The slowest pace an instance reported over its last committing steps."""

from __future__ import annotations

from collections import deque


class RecentPaces:
    """An instance's seconds a token over its last ``window_steps`` committing steps, so
    that admission can price its rows at the slowest of them.

    On a host whose instances share its cores with each other and with the server's own
    work, the pace swings two- to threefold within seconds under a prompt-heavy load.
    Admission promises starts (when running rows end) and lets prompts start beside
    running rows from a pace; a promise made at the pace of a quick moment breaks in the
    next slow spell, and its rows end late. The slowest pace of the last window is one
    the rows have just shown they fall to. A window of one step is the pace now."""

    def __init__(self, window_steps: int) -> None:
        if window_steps < 1:
            raise ValueError(f"window_steps must be at least 1, got {window_steps}")
        self._window_steps = window_steps
        # (committing steps when reported, seconds a token), steps strictly increasing
        self._paces: deque[tuple[int, float]] = deque(maxlen=window_steps)

    def record(self, committed_steps: int, seconds_per_token: float) -> None:
        """One report of the instance (0 seconds a token: not measured yet, ignored)."""
        if seconds_per_token <= 0:
            return
        if self._paces and committed_steps < self._paces[-1][0]:
            self._paces.clear()  # the engine started again: its step count began anew
        if self._paces and committed_steps == self._paces[-1][0]:
            self._paces.pop()  # a later report of the same step: the newer measure holds
        self._paces.append((committed_steps, seconds_per_token))

    def slowest_s(self) -> float:
        """The slowest seconds a token reported within the window (0 before any)."""
        if not self._paces:
            return 0.0
        oldest = self._paces[-1][0] - self._window_steps
        return max(pace for steps, pace in self._paces if steps > oldest)
