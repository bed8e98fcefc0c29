"""What each K actually delivered, as a correction of what the cost model predicted.

The goodput choice of K rests on a fitted pass-cost model and on per-row acceptance
estimates; both can be wrong in ways that matter (a loaded CPU, Python overhead per
step, padded verify shapes under compilation, a fresh engine's guessed acceptance).
So every step that ran K reports the tokens it committed and the seconds it took,
and this module keeps, per batch-size bucket and per K, the ratio of realised to
predicted tokens and of realised to predicted seconds. A K's corrected goodput is
its prediction times those ratios: the cost model is the prior, realised goodput the
evidence (a contextual bandit over K, as BanditSpec runs one over speculation settings).

- K = 0 is always an arm; its token count is exact (one per row), so only its time
  is corrected.
- A speculative arm that has run little borrows what the speculative arms tried in its
  bucket say of it (their corrections on a line in K): when speculation costs more
  than predicted, every K > 0 learns it from the first Ks tried.
- Evidence is discounted per step (recent steps weigh most), so a changed cost or
  acceptance is learnt again: an arm left alone falls back to what the cost model
  (itself refitted on every pass) predicts, and its optimism bonus grows as its
  evidence fades (discounted UCB, Garivier and Moulines 2011), so a K is retried when
  its corrected goodput comes close to the best's. The bonus is divided by the K's
  step time over a plain step's, since a probe of a long K costs that many steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Evidence older by n steps of a bucket weighs DISCOUNT**n (about 100 steps of memory).
DISCOUNT = 0.99
# Weight, in steps, of an arm's prior (what the other arms say, or 1 before any says).
PRIOR_STEPS = 2.0
# Scale of the optimism bonus: a K whose evidence has faded is retried when its
# corrected goodput is within about this fraction (times a few) of the best's.
EXPLORATION = 0.03


@dataclass
class _Evidence:
    """Discounted sums of one arm: steps, realised/predicted tokens and seconds."""

    steps: float = 0.0
    token_ratio: float = 0.0
    time_ratio: float = 0.0

    def decay(self) -> None:
        self.steps *= DISCOUNT
        self.token_ratio *= DISCOUNT
        self.time_ratio *= DISCOUNT

    def corrections(self, prior: tuple[float, float]) -> tuple[float, float]:
        """(tokens, seconds) realised per predicted, shrunk towards ``prior``."""
        weight = self.steps + PRIOR_STEPS
        return (
            (self.token_ratio + PRIOR_STEPS * prior[0]) / weight,
            (self.time_ratio + PRIOR_STEPS * prior[1]) / weight,
        )


@dataclass
class _Bucket:
    arms: dict[int, _Evidence] = field(default_factory=dict)

    def arm(self, k: int) -> _Evidence:
        return self.arms.setdefault(k, _Evidence())

    def speculative_prior(self, k: int) -> tuple[float, float]:
        """What the speculative arms tried so far say of K = ``k``: their corrections on a
        line in K (a mispriced verify token or draft pass errs in proportion to K), shrunk
        towards 1 by how much evidence there is."""
        tried = [(j, e) for j, e in self.arms.items() if j > 0 and e.steps > 0]
        weight = sum(e.steps for _, e in tried)
        if not tried:
            return 1.0, 1.0
        tokens = _line_at(k, [(j, e.steps, e.token_ratio / e.steps) for j, e in tried])
        seconds = _line_at(k, [(j, e.steps, e.time_ratio / e.steps) for j, e in tried])
        return (
            (weight * tokens + PRIOR_STEPS) / (weight + PRIOR_STEPS),
            (weight * seconds + PRIOR_STEPS) / (weight + PRIOR_STEPS),
        )


def _line_at(k: int, points: list[tuple[int, float, float]]) -> float:
    """The weighted least-squares line through (K, weight, ratio) points, at ``k``; the
    weighted mean when the points share one K. Kept within the ratios seen, so a line
    through two close Ks is not carried far past them."""
    total = sum(w for _, w, _ in points)
    mean_k = sum(w * j for j, w, _ in points) / total
    mean_r = sum(w * r for _, w, r in points) / total
    spread = sum(w * (j - mean_k) ** 2 for j, w, _ in points)
    slope = sum(w * (j - mean_k) * (r - mean_r) for j, w, r in points) / spread if spread > 0 else 0.0
    low, high = min(r for *_, r in points), max(r for *_, r in points)
    reach = high - low
    return min(high + reach, max(low - reach, mean_r + slope * (k - mean_k), 0.05 * low))


def batch_bucket(rows: int) -> int:
    """Batch sizes 1, 2-3, 4-7, 8-15, ... share their evidence."""
    return max(1, rows).bit_length()


class RealisedGoodput:
    """Per batch-size bucket and per K: how realised steps compare with predictions."""

    def __init__(self) -> None:
        self._buckets: dict[int, _Bucket] = {}

    def record(
        self, rows: int, k: int, predicted: tuple[float, float], realised: tuple[float, float]
    ) -> None:
        """One step of ``rows`` rows ran K = ``k``; ``predicted`` and ``realised`` are
        (committed tokens, seconds)."""
        if min(*predicted, *realised) <= 0:
            return
        bucket = self._buckets.setdefault(batch_bucket(rows), _Bucket())
        for evidence in bucket.arms.values():
            evidence.decay()
        arm = bucket.arm(k)
        arm.steps += 1
        arm.token_ratio += 1.0 if k == 0 else realised[0] / predicted[0]
        arm.time_ratio += realised[1] / predicted[1]

    def corrections(self, rows: int, k: int) -> tuple[float, float]:
        """A K's (tokens, seconds) realised per predicted at this batch size."""
        bucket = self._buckets.get(batch_bucket(rows), _Bucket())
        prior = (1.0, 1.0) if k == 0 else bucket.speculative_prior(k)
        return bucket.arms.get(k, _Evidence()).corrections(prior)

    def optimistic(self, rows: int, k: int, rate: float, relative_cost: float) -> float:
        """A corrected rate plus the bonus of the evidence it lacks. ``relative_cost`` is
        the K's step time over a plain step's: a probe of a long K costs that many
        plain steps, so its bonus is that much smaller."""
        bucket = self._buckets.get(batch_bucket(rows), _Bucket())
        total = sum(e.steps for e in bucket.arms.values())
        steps = bucket.arms.get(k, _Evidence()).steps
        bonus = EXPLORATION * math.sqrt(math.log(1.0 + total) / (steps + PRIOR_STEPS))
        return rate * (1.0 + bonus / max(1.0, relative_cost))
