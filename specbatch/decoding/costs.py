"""What a forward pass costs, measured: the input to choosing K by goodput.

Whether speculation pays depends on the draft-pass cost c(B) and the verify-pass cost
v(B, K) at the batch size actually running, and those depend on the machine: on a
GPU a K+1-token verify costs about one token while memory-bound, on a loaded CPU it
is partly compute-bound. So each pass is timed and a model per network is fitted
online: seconds = a + b * tokens fed + c * KV slots gathered + d * query-key pairs
attended (least squares over the recent passes, coefficients kept non-negative). The
last term is why a K+1-token verify over a long context costs more than K+1 times
the weights: every query attends to the whole span. A short calibration at start-up
spreads the features before the first real step.

Recent passes are kept per width (the tokens each row was fed, in classes 1, 2-3, 4-7,
...), not in one window: a long run of one width (every target pass a two-token verify
while speculating at one row) would otherwise leave only passes whose constant and
per-token terms cannot be told apart, and the prediction of any other width (the plain
pass the choice of K compares against) would be an extrapolation off by a quarter.
"""

from __future__ import annotations

from collections import deque

import numpy as np

WINDOW_PER_WIDTH = 128  # recent passes kept per width class
REFIT_EVERY = 16


def width_class(tokens: int, slots: int, pairs: int) -> int:
    """The class of a pass's width, the tokens each row was fed: query-key pairs over KV
    slots (each fed token attends to its row's slots), 0 where there is no attention
    (a step's overhead); classes 1, 2-3, 4-7, ... hold widths of about the same cost."""
    return round(pairs / slots).bit_length() if slots else 0


class PassCosts:
    """Online cost model of one network's forward passes."""

    def __init__(self, window_per_width: int = WINDOW_PER_WIDTH) -> None:
        self._window = window_per_width
        self._observations: dict[int, deque[tuple[float, float, float, float]]] = {}
        self._terms = (0.0, 0.0, 0.0, 0.0)  # the coefficients as floats: predict runs per K per step
        self._since_fit = 0

    @property
    def observations(self) -> int:
        return sum(len(kept) for kept in self._observations.values())

    def observe(self, tokens: int, slots: int, pairs: int, seconds: float) -> None:
        kept = self._observations.setdefault(width_class(tokens, slots, pairs), deque(maxlen=self._window))
        kept.append((float(tokens), float(slots), float(pairs), float(seconds)))
        self._since_fit += 1
        if self._since_fit >= REFIT_EVERY or self.observations <= REFIT_EVERY:
            self._fit()

    def predict(self, tokens: float, slots: float, pairs: float) -> float:
        """Seconds for a pass feeding ``tokens`` tokens, gathering ``slots`` KV slots and
        attending ``pairs`` query-key pairs."""
        constant, per_token, per_slot, per_pair = self._terms
        return constant + per_token * tokens + per_slot * slots + per_pair * pairs

    def _fit(self) -> None:
        self._since_fit = 0
        data = np.array([observation for kept in self._observations.values() for observation in kept])
        if len(data) == 0:
            return
        features = np.column_stack([np.ones(len(data)), data[:, :3]])
        seconds = data[:, 3]
        active = [0, 1, 2, 3]
        coefficients = np.zeros(4)
        # Non-negative least squares by elimination: drop the feature with the most
        # negative coefficient and refit on the rest (at most four fits).
        while active:
            solution, *_ = np.linalg.lstsq(features[:, active], seconds, rcond=None)
            if (solution >= 0).all():
                coefficients[active] = solution
                break
            active.pop(int(np.argmin(solution)))
        self._terms = tuple(float(c) for c in coefficients)
