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
- Tokens are judged across the speculative arms, never one K alone: every K > 0 takes
  the ratio on the line in K through all their evidence. Acceptance is a property of
  the draft per token, which every K measures (the line keeps what a longer draft
  loses further out); one step's tokens, a run of 1 to K + 1, vary by half their mean
  at α = 0.9, so a K judged by its own few steps is locked out by one unlucky probe.
  Nor may a few steps of one K tilt that line: each arm's point is its ratio shrunk
  towards all the speculative arms' pooled ratio by the weight of a few steps. One step
  of K = 7 that commits one token (at α = 0.92 one step in twelve) sits far from the Ks
  mostly run, where it tilts a least-squares line most: taken at face value, one such
  step of K = 6 and one of K = 7 after sixty of K = 3 priced K = 6 at half its tokens,
  and locked the long Ks out for a few hundred steps (shrunk: 0.91x).
- Seconds are judged per arm, since padding and pass shapes differ by K; an arm that
  has run little borrows the line through the other speculative arms' ratios, so when
  speculation costs more than predicted every K > 0 learns it from the first Ks tried.
- Evidence is discounted (recent steps weigh most), so a changed cost or acceptance
  is learnt again: a plain step ages the plain arm, a speculative step every
  speculative arm (near-tied Ks taking turns must forget a changed cost as fast as one
  K would). An arm left alone falls back, slowly, to what the cost model
  (itself refitted on every pass) predicts, and its optimism bonus grows as its
  evidence fades (discounted UCB, Garivier and Moulines 2011), so a K is retried when
  its corrected goodput comes close to the best's. The bonus is divided by what a
  probe costs over a plain step (the K's step, and catching lagging drafts up in
  full), since a probe of a long K, or after long plain decoding, costs that many steps.
- Plain decoding (K = 0) gets the bonus only where the policy has mostly speculated at
  that batch size (plain's discounted steps fewer than the speculative arms' together).
  Its tokens are exact and every plain pass refits its cost, so where it mostly runs
  there is nothing about it to find out, and a bonus there would only raise the bar
  every K > 0's probe must clear. But while speculation runs no plain pass does: its
  price rests on one-token passes however old and on a correction fading back to the
  cost model: with a plain step priced at 1.22x its cost, a policy that first settled on
  a K = 1 running 0.9x plain decoding held it for good in two runs of six. Its probe
  costs one plain step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

# Per step of a bucket, the arms on the side that ran (plain, or speculative) keep
# DISCOUNT of their evidence (about 100 steps of memory) and those on the other side
# IDLE_DISCOUNT (about 400 steps): speculation switched off fades back to the cost
# model's word slowly, so it is not retried every few dozen steps, yet is in the end.
DISCOUNT = 0.99
IDLE_DISCOUNT = 0.9975
# Weight, in steps, of an arm's prior (what the other arms say, or 1 before any says),
# and of the flat line towards which the speculative arms' line is shrunk.
PRIOR_STEPS = 2.0
# Ridge on the slope of the line through the arms' ratios, in steps x K²: the weight
# of a flat line (eight steps one K away from the mean).
SLOPE_PRIOR = 8.0
# Weight, in steps, of the pooled ratio each arm's point on the tokens line is shrunk
# towards (see the module's docstring).
POINT_PRIOR_STEPS = 8.0
# Scale of the optimism bonus: a K whose evidence has faded is retried when its
# corrected goodput is within about this fraction (times a few) of the best's. Divided
# by what a probe costs over a plain step, it must still outbid a cost model a few per
# cent wrong: at 0.03 (with a bonus on plain decoding too) the policy did not probe K = 1
# on the α ≈ 0.5 pair at one row, where K = 1 ran 1.15x plain decoding; at 0.1 it did
# in a head-to-head run, though not in the full benchmark's run
# (docs/BENCHMARKS_HISTORY.md, "A wider optimism bonus, none for plain decoding").
EXPLORATION = 0.1


@dataclass
class _Evidence:
    """Discounted sums of one arm's steps: predicted and realised tokens and seconds."""

    steps: float = 0.0
    predicted_tokens: float = 0.0
    realised_tokens: float = 0.0
    predicted_seconds: float = 0.0
    realised_seconds: float = 0.0

    def decay(self, factor: float) -> None:
        self.steps *= factor
        self.predicted_tokens *= factor
        self.realised_tokens *= factor
        self.predicted_seconds *= factor
        self.realised_seconds *= factor

    def add_weighted(self, other: _Evidence, weight: float) -> None:
        self.steps += weight * other.steps
        self.predicted_tokens += weight * other.predicted_tokens
        self.realised_tokens += weight * other.realised_tokens
        self.predicted_seconds += weight * other.predicted_seconds
        self.realised_seconds += weight * other.realised_seconds

    def add(self, predicted: tuple[float, float], realised: tuple[float, float]) -> None:
        self.steps += 1
        self.predicted_tokens += predicted[0]
        self.realised_tokens += realised[0]
        self.predicted_seconds += predicted[1]
        self.realised_seconds += realised[1]


def _shrunk(
    realised: float, predicted: float, steps: float, prior: float, weight: float = PRIOR_STEPS
) -> float:
    """Realised per predicted over ``steps`` steps (a ratio of sums: one step's outcome,
    a run of 1 to K + 1 tokens, is far noisier than their total), shrunk towards
    ``prior`` with the weight of ``weight`` steps."""
    if steps <= 0 or predicted <= 0:
        return prior
    per_step = predicted / steps
    return (realised + weight * prior * per_step) / (predicted + weight * per_step)


def _token_points(arms: list[tuple[int, _Evidence]]) -> list[tuple[int, float, float]]:
    """Each speculative arm's (K, steps, realised per predicted tokens) for the line
    through them, each ratio shrunk towards all the arms' pooled ratio with the weight
    of POINT_PRIOR_STEPS steps, so an arm of a few steps moves the line by what a few
    steps can tell. Seconds are not shrunk so: a step's time varies far less than its
    tokens, and the first Ks tried must tell the line how a mispriced per-token cost
    grows with K."""
    realised = sum(evidence.realised_tokens for _, evidence in arms)
    predicted = sum(evidence.predicted_tokens for _, evidence in arms)
    pooled = realised / predicted if predicted > 0 else 1.0
    return [
        (k, e.steps, _shrunk(e.realised_tokens, e.predicted_tokens, e.steps, pooled, POINT_PRIOR_STEPS))
        for k, e in arms
    ]


@dataclass
class _Bucket:
    arms: dict[int, _Evidence] = field(default_factory=dict)

    def arm(self, k: int) -> _Evidence:
        return self.arms.setdefault(k, _Evidence())

    def corrections(self, ks: Iterable[int]) -> list[tuple[float, float]]:
        """Each K's (tokens, seconds) realised per predicted: tokens from every
        speculative arm's line, seconds from K's own steps shrunk towards theirs. The
        lines are fitted once for all the Ks asked of (the choice asks of nine a step)."""
        speculative = [(j, e) for j, e in self.arms.items() if j > 0 and e.steps > 0]
        tokens = _speculative_line(_token_points(speculative))
        seconds = _speculative_line(
            [(j, e.steps, e.realised_seconds / e.predicted_seconds) for j, e in speculative]
        )
        found = []
        for k in ks:
            arm = self.arms.get(k, _Evidence())
            prior = (1.0, 1.0) if k == 0 else (tokens(k), seconds(k))
            found.append(
                (prior[0], _shrunk(arm.realised_seconds, arm.predicted_seconds, arm.steps, prior[1]))
            )
        return found


def _speculative_line(points: list[tuple[int, float, float]]) -> Callable[[int], float]:
    """What the speculative arms tried so far say of each K: their (K, steps, ratio)
    on a line in K (an acceptance or a per-token cost mispredicted errs more the
    longer K is), shrunk towards 1 by how much evidence there is."""
    if not points:
        return lambda k: 1.0
    weight = sum(w for _, w, _ in points)
    line = _line(points)
    return lambda k: (weight * line(k) + PRIOR_STEPS) / (weight + PRIOR_STEPS)


def _line(points: list[tuple[int, float, float]]) -> Callable[[int], float]:
    """The weighted least-squares line through (K, weight, ratio) points. Its slope is
    shrunk towards 0 (ridge, SLOPE_PRIOR): an arm run once or twice must not tilt what
    every other K is expected to deliver. Kept within the ratios seen, so a line
    through two close Ks is not carried far past them."""
    total = sum(w for _, w, _ in points)
    mean_k = sum(w * j for j, w, _ in points) / total
    mean_r = sum(w * r for _, w, r in points) / total
    spread = sum(w * (j - mean_k) ** 2 for j, w, _ in points) + SLOPE_PRIOR
    slope = sum(w * (j - mean_k) * (r - mean_r) for j, w, r in points) / spread
    low, high = min(r for *_, r in points), max(r for *_, r in points)
    reach = high - low
    return lambda k: min(high + reach, max(low - reach, mean_r + slope * (k - mean_k), 0.05 * low))


def batch_bucket(rows: int) -> int:
    """Batch sizes 1, 2-3, 4-7, 8-15, ... record their evidence together."""
    return max(1, rows).bit_length()


def bucket_weights(rows: int) -> list[tuple[int, float]]:
    """The buckets a batch of ``rows`` reads its evidence from, and their weights: all
    of its own, and of the neighbour nearer it the share its distance from its own
    bucket's middle (in log2(rows)) gives, up to all of it at the edge. A batch of 30
    rows and one of 32 run alike but fall either side of an edge; read from one bucket
    each, a closed loop at 32 clients decoded plain at 28-31 rows on that bucket's
    stale evidence while speculating at 32 rows paid 1.3x (a90). The own bucket keeps
    its full weight, so a batch size alone in its neighbourhood learns as fast as ever."""
    position = math.log2(max(1, rows))
    own = batch_bucket(rows)
    offset = position - (own - 0.5)  # from the middle of [2^(own-1), 2^own) in log2
    if own == 1 or offset == 0:
        return [(own, 1.0)]
    neighbour = own + 1 if offset > 0 else own - 1
    return [(own, 1.0), (neighbour, abs(offset) / (1.0 - abs(offset)))]


class RealisedGoodput:
    """Per batch-size bucket and per K: how realised steps compare with predictions,
    each batch size read from its bucket and the nearer neighbour."""

    def __init__(self) -> None:
        self._buckets: dict[int, _Bucket] = {}
        # what each batch size read since the last step was recorded: a choice reads
        # its batch size once for the corrections and again for every K's bonus
        self._reads: dict[int, _Bucket] = {}

    def record(
        self, rows: int, k: int, predicted: tuple[float, float], realised: tuple[float, float]
    ) -> None:
        """One step of ``rows`` rows ran K = ``k``; ``predicted`` and ``realised`` are
        (committed tokens, seconds)."""
        if min(*predicted, *realised) <= 0:
            return
        self._reads.clear()
        bucket = self._buckets.setdefault(batch_bucket(rows), _Bucket())
        for arm, evidence in bucket.arms.items():
            evidence.decay(DISCOUNT if (arm > 0) == (k > 0) else IDLE_DISCOUNT)
        bucket.arm(k).add(predicted, realised)

    def corrections(self, rows: int, ks: Iterable[int]) -> list[tuple[float, float]]:
        """Each K's (tokens, seconds) realised per predicted at this batch size."""
        return self._read(rows).corrections(ks)

    def _read(self, rows: int) -> _Bucket:
        """The evidence a batch of ``rows`` is judged on: its bucket's and its nearer
        neighbour's, weighted (:func:`bucket_weights`)."""
        if rows not in self._reads:
            read = _Bucket()
            for bucket, weight in bucket_weights(rows):
                for k, evidence in self._buckets.get(bucket, _Bucket()).arms.items():
                    read.arm(k).add_weighted(evidence, weight)
            self._reads[rows] = read
        return self._reads[rows]

    def steps(self, rows: int, k: int) -> float:
        """The discounted steps of K at this batch size that its correction rests on."""
        return self._read(rows).arms.get(k, _Evidence()).steps

    def speculated(self, rows: int) -> bool:
        """Whether any K > 0 has ever run at this batch size (its bucket or the nearer
        neighbour it reads), however long ago."""
        return any(k > 0 for k in self._read(rows).arms)

    def speculative_steps(self, rows: int) -> float:
        """The discounted steps of every K > 0 together at this batch size."""
        return sum(e.steps for k, e in self._read(rows).arms.items() if k > 0)

    def optimistic(
        self, rows: int, k: int, rate: float, relative_cost: float, optimism: float = 0.0
    ) -> float:
        """A corrected rate plus the bonus of the evidence it lacks and the caller's own
        ``optimism`` (a fraction of the rate: the acceptance bound's). ``relative_cost``
        is what a probe of K costs over a plain step: a long K's step, and the whole
        catch-up of drafts that lag (a probe that ends in plain decoding again repays
        none of it), cost that many plain steps, so both bonuses are that much smaller.
        Plain decoding (K = 0) gets one only where speculation has mostly run (see the
        module's docstring)."""
        bucket = self._read(rows)
        total = sum(e.steps for e in bucket.arms.values())
        steps = self.steps(rows, k)
        if k == 0 and steps >= self.speculative_steps(rows):
            return rate
        bonus = EXPLORATION * math.sqrt(math.log(1.0 + total) / (steps + PRIOR_STEPS)) + optimism
        return rate * (1.0 + bonus / max(1.0, relative_cost))
