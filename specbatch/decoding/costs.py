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
"""

from __future__ import annotations

from collections import deque

import numpy as np

WINDOW = 512
REFIT_EVERY = 16


class PassCosts:
    """Online cost model of one network's forward passes."""

    def __init__(self, window: int = WINDOW) -> None:
        self._observations: deque[tuple[float, float, float, float]] = deque(maxlen=window)
        self._terms = (0.0, 0.0, 0.0, 0.0)  # the coefficients as floats: predict runs per K per step
        self._since_fit = 0

    @property
    def observations(self) -> int:
        return len(self._observations)

    def observe(self, tokens: int, slots: int, pairs: int, seconds: float) -> None:
        self._observations.append((float(tokens), float(slots), float(pairs), float(seconds)))
        self._since_fit += 1
        if self._since_fit >= REFIT_EVERY or len(self._observations) <= REFIT_EVERY:
            self._fit()

    def predict(self, tokens: float, slots: float, pairs: float) -> float:
        """Seconds for a pass feeding ``tokens`` tokens, gathering ``slots`` KV slots and
        attending ``pairs`` query-key pairs."""
        constant, per_token, per_slot, per_pair = self._terms
        return constant + per_token * tokens + per_slot * slots + per_pair * pairs

    def _fit(self) -> None:
        self._since_fit = 0
        data = np.array(self._observations)
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
