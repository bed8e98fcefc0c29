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

The machine's speed is read apart from that structure, as a pace: the passes are taken
in blocks of REFIT_EVERY, each block's pace is its seconds over what the fit predicts
for its passes (each width's prediction scaled by how far that width's own passes sit
off the fit), and the windows keep every pass's seconds with its own block's pace
divided out; a prediction is the fit times the pace of the latest two blocks. A fit
over raw seconds lags a machine whose speed changed: while the policy speculates, the
plain passes kept are as old as the last plain decoding, so the plain step stayed
priced at the old speed, and each realised correction (:mod:`specbatch.decoding.realised`,
a ratio to what was predicted when the step ran) took up the speed of its moment and
counted it again once the fit caught up. With the pace, a change of speed reaches every
width within a few blocks (a 1.3x slowdown read as 1.18x after two, 1.27x after four),
and a correction keeps what the model gets wrong about a K. A width's own offset from
the line is kept apart from the pace (a long run of one width the linear fit misses by
a few per cent is not read as the machine slowing, and not carried to the other widths'
prices); a block's pace is read from its passes of widths the fit already knows, and
divides out of its own passes, not a pace read before them.
"""

from __future__ import annotations

from collections import deque

import numpy as np

WINDOW_PER_WIDTH = 128  # recent passes kept per width class
REFIT_EVERY = 16  # passes in a block: the fit and the pace are read once a block
PACE_BLOCKS = 2  # the latest blocks a prediction's pace is read from


def width_class(tokens: int, slots: int, pairs: int) -> int:
    """The class of a pass's width, the tokens each row was fed: query-key pairs over KV
    slots (each fed token attends to its row's slots), 0 where there is no attention
    (a step's overhead); classes 1, 2-3, 4-7, ... hold widths of about the same cost."""
    return round(pairs / slots).bit_length() if slots else 0


Pass = tuple[float, float, float, float]  # tokens fed, KV slots, query-key pairs, seconds


class PassCosts:
    """Online cost model of one network's forward passes: a linear fit of their cost at
    a steady speed, times the machine's recent pace."""

    def __init__(self, window_per_width: int = WINDOW_PER_WIDTH) -> None:
        self._window = window_per_width
        self._observations: dict[int, deque[Pass]] = {}  # seconds with their block's pace divided out
        self._terms = np.zeros(4)
        self._offsets: dict[int, float] = {}  # per width, its passes' seconds over the fit's
        self._block: list[Pass] = []  # the passes since the last block was taken in
        self._latest: deque[tuple[float, float]] = deque(maxlen=PACE_BLOCKS)  # blocks' seconds, fitted
        self._scaled_terms = (0.0, 0.0, 0.0, 0.0)  # the fit times the pace, as floats: predict is hot
        self.most_tokens = 0.0  # the most tokens any pass observed fed

    @property
    def observations(self) -> int:
        return sum(len(kept) for kept in self._observations.values()) + len(self._block)

    @property
    def pace(self) -> float:
        """The latest blocks' seconds over what the fit predicts for them (1: as fitted,
        or where they took no time: a pace divides the passes kept, so it is never 0)."""
        seconds, fitted = (sum(block[i] for block in self._latest) for i in (0, 1))
        return seconds / fitted if fitted > 0 and seconds > 0 else 1.0

    def observe(self, tokens: int, slots: int, pairs: int, seconds: float) -> None:
        self.most_tokens = max(self.most_tokens, float(tokens))
        self._block.append((float(tokens), float(slots), float(pairs), float(seconds)))
        if len(self._block) >= REFIT_EVERY or self.observations <= REFIT_EVERY:
            self._take_in_block()

    def predict(self, tokens: float, slots: float, pairs: float) -> float:
        """Seconds for a pass feeding ``tokens`` tokens, gathering ``slots`` KV slots and
        attending ``pairs`` query-key pairs, at the machine's recent pace."""
        constant, per_token, per_slot, per_pair = self._scaled_terms
        return constant + per_token * tokens + per_slot * slots + per_pair * pairs

    def _take_in_block(self) -> None:
        """Read the block's pace against the fit so far, keep its passes with that pace
        divided out, refit, and read the pace of the latest blocks against the new fit.
        At start-up, each pass a block of its own until REFIT_EVERY are kept, passes are
        kept as they are: a pass's own pace would divide out all it says."""
        block = np.array(self._block)
        widths = [width_class(t, s, p) for t, s, p, _ in self._block]
        self._block = []
        pace = self._block_pace(block, widths) if len(block) >= REFIT_EVERY else 1.0
        for width, (tokens, slots, pairs, seconds) in zip(widths, block, strict=True):
            kept = self._observations.setdefault(width, deque(maxlen=self._window))
            kept.append((tokens, slots, pairs, seconds / pace))
        self._fit()
        self._latest.append((float(block[:, 3].sum()), float(self._expected(block, widths).sum())))
        self._scaled_terms = tuple(float(term) * self.pace for term in self._terms)

    def _block_pace(self, block: np.ndarray, widths: list[int]) -> float:
        """The block's pace, read from its passes of widths the windows already hold a
        block of (the latest pace where it has none): a width new to the fit is priced by
        extrapolation, and its first passes must teach the fit its level, not be read as
        the machine's speed."""
        known = [len(self._observations.get(width, ())) >= REFIT_EVERY for width in widths]
        if not any(known):
            return self.pace
        known_widths = [width for width, is_known in zip(widths, known, strict=True) if is_known]
        fitted = float(self._expected(block[known], known_widths).sum())
        seconds = float(block[known, 3].sum())
        return seconds / fitted if fitted > 0 and seconds > 0 else self.pace

    def _expected(self, passes: np.ndarray, widths: list[int]) -> np.ndarray:
        """The fit's seconds for ``passes`` of these widths at a steady speed, each
        width's offset included."""
        offsets = np.array([self._offsets.get(width, 1.0) for width in widths])
        return _features(passes) @ self._terms * offsets

    def _fit(self) -> None:
        windows = list(self._observations.values())
        data = np.array([observation for kept in windows for observation in kept])
        features, seconds = _features(data), data[:, 3]
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
        self._terms = coefficients
        ends = np.cumsum([len(kept) for kept in windows])[:-1]
        fitted = features @ coefficients
        for width, kept_seconds, kept_fitted in zip(
            self._observations, np.split(seconds, ends), np.split(fitted, ends), strict=True
        ):
            total = float(kept_fitted.sum())
            self._offsets[width] = float(kept_seconds.sum()) / total if total > 0 else 1.0


def _features(passes: np.ndarray) -> np.ndarray:
    """The fit's features of each pass: 1 (the constant), tokens, slots, pairs."""
    return np.column_stack([np.ones(len(passes)), passes[:, :3]])
