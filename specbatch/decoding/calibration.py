"""What rows accept after their acceptance estimate read a given value.

The goodput choice of K predicts each row's committed tokens from the row's acceptance
estimate (:meth:`specbatch.decoding.rows.Row.alpha`). An estimate can be right on
average and wrong where it is highest: the rows whose estimate reads 0.95 are, more
than others, the rows that just had a lucky run, and the next steps regress towards
what they really accept. The policy runs the long Ks exactly there, so those Ks
deliver less than predicted and the correction per K (:mod:`specbatch.decoding.realised`)
learns them as worse than they are everywhere else (a90 at one client: steps of
K = 7-8 at an estimate near 0.95 committed 0.64-0.92x the tokens predicted, near 0.90
0.94-1.07x; fixed K = 7-8 ran 3-8 % ahead of the K = 4-6 goodput settled on).

So every speculative step's rows are scored against their estimates: per band of the
estimate, the draft tokens they then accepted against the estimate's expectation, per
draft token verified (accepted, or the one rejected). A band's offset (realised minus
estimated acceptance) is shrunk towards 0 by CALIBRATION_PRIOR_TRIALS of evidence,
discounted as the instance-wide acceptance is, and read between band centres; the
calibrated estimate is the row's estimate plus that offset. Nothing moves before rows
have speculated, so a fresh engine's optimism (which makes it try speculation at all)
is untouched; a fixed K never reads it.
"""

from __future__ import annotations

from collections.abc import Sequence

BANDS = 20
# Per speculative step every band keeps this share of its evidence: about 500 steps of
# memory, longer than the instance-wide acceptance's 200 (rows.ALPHA_DECAY), since how
# far an estimate errs is a property of the estimator and the pair that moves slowly,
# and at one row 200 steps spread a thousand draft tokens over a dozen bands.
CALIBRATION_DECAY = 0.998
# Weight, in verified draft tokens, of "the estimate is right" in a band's offset: a
# few steps of one row (a run of 1 to K + 1 tokens each) do not move it far.
CALIBRATION_PRIOR_TRIALS = 32.0


class AcceptanceCalibration:
    """Per band of the acceptance estimate: verified draft tokens, accepted ones, and
    what the estimates expected of them."""

    def __init__(self) -> None:
        self._trials = [0.0] * BANDS
        self._accepted = [0.0] * BANDS
        self._expected = [0.0] * BANDS

    def record(self, estimates: Sequence[float], accepted: Sequence[int], lookahead: int) -> None:
        """One step of K = ``lookahead``: each row's estimate when K was chosen and the
        draft tokens it accepted (fewer than K: one was rejected)."""
        if lookahead <= 0 or not accepted:
            return
        for band in range(BANDS):
            self._trials[band] *= CALIBRATION_DECAY
            self._accepted[band] *= CALIBRATION_DECAY
            self._expected[band] *= CALIBRATION_DECAY
        for estimate, taken in zip(estimates, accepted, strict=True):
            trials = taken + (taken < lookahead)
            band = _band(estimate)
            self._trials[band] += trials
            self._accepted[band] += taken
            self._expected[band] += trials * estimate

    def offset(self, estimate: float) -> float:
        """Realised minus estimated acceptance per verified draft token near
        ``estimate``, shrunk towards 0: the two nearest bands' evidence, weighted
        linearly by the distance to their centres, so that a small change of estimate
        never jumps the prediction, and an estimate between a band with evidence and
        one without reads the evidence it has at full strength."""
        position = min(max(estimate * BANDS - 0.5, 0.0), BANDS - 1.0)
        low = int(position)
        high = min(low + 1, BANDS - 1)
        weights = ((low, 1.0 - (position - low)), (high, position - low))
        surplus = sum(w * (self._accepted[b] - self._expected[b]) for b, w in weights)
        trials = sum(w * self._trials[b] for b, w in weights)
        return surplus / (trials + CALIBRATION_PRIOR_TRIALS)

    def calibrated(self, estimate: float) -> float:
        """``estimate`` moved by the offset rows near it showed."""
        return min(1.0, max(0.0, estimate + self.offset(estimate)))


def _band(estimate: float) -> int:
    return min(BANDS - 1, max(0, int(estimate * BANDS)))
