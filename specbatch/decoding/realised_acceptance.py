"""How often the draft's tokens were actually accepted, position by position, as a
correction of the acceptance the choice of K assumed.

The goodput choice predicts a row's committed tokens from its acceptance estimate α:
1 + α + … + α^K. That estimate is wrong in ways K matters for: the instance-wide prior
it starts from is optimistic on purpose (so that a fresh instance tries speculating
and measures), and acceptance may fall, or rise, further into the draft. So every
speculative step reports each row's accepted run, and this keeps, per draft position,
how many tokens reached it, how many of them were accepted and how many the estimates
said would be. A row's acceptance at position j is then its estimate times position
j's realised-over-predicted factor.

Why per position, not per K: one step's tokens, a run of 1 to K + 1, vary by half
their mean at α = 0.9, so a K judged by its own few steps (or by a line through the
Ks' token ratios) is condemned by one unlucky probe, and the K that has run most keeps
running. A rejected first token is one outcome at position 1, where every step has
evidence, and the far positions only ever add to what the near ones say: a position
with little evidence takes the factor pooled over every position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specbatch.decoding.realised_cost import DISCOUNT

# Per speculative step every position keeps DISCOUNT of its evidence, the memory the
# steps' costs have (about 100 steps), so a changed acceptance is learnt again.
# Weight, in draft tokens, of the factor 1 in the pooled factor, and of the pooled
# factor in one position's.
POOLED_PRIOR = 4.0
POSITION_PRIOR = 20.0


@dataclass
class _Position:
    """Discounted counts of the draft tokens that reached one position."""

    trials: float = 0.0
    accepted: float = 0.0
    predicted: float = 0.0


class RealisedAcceptance:
    """Per draft position: realised acceptance over the acceptance the estimates gave."""

    def __init__(self, positions: int) -> None:
        self._positions = [_Position() for _ in range(positions)]

    def record(self, alphas: Sequence[float], runs: Sequence[int], lookahead: int) -> None:
        """One speculative step with K = ``lookahead``: the row estimated at
        ``alphas[i]`` had the first ``runs[i]`` of its draft tokens accepted (a run
        short of K ends in the one rejection that was judged; later tokens were not)."""
        if not runs:
            return
        for position in self._positions:
            position.trials *= DISCOUNT
            position.accepted *= DISCOUNT
            position.predicted *= DISCOUNT
        for alpha, run in zip(alphas, runs, strict=True):
            for index in range(min(run + 1, lookahead, len(self._positions))):
                position = self._positions[index]
                position.trials += 1.0
                position.accepted += index < run
                position.predicted += alpha

    def factors(self) -> list[float]:
        """Per position (the first draft token first), what multiplies a row's estimate
        to give its acceptance there."""
        trials = sum(p.trials for p in self._positions)
        if trials <= 0.0:
            return [1.0] * len(self._positions)
        accepted = sum(p.accepted for p in self._positions)
        predicted = sum(p.predicted for p in self._positions)
        mean_alpha = predicted / trials
        pooled = (accepted + POOLED_PRIOR * mean_alpha) / (predicted + POOLED_PRIOR * mean_alpha)
        prior = POSITION_PRIOR * mean_alpha
        return [(p.accepted + prior * pooled) / (p.predicted + prior) for p in self._positions]


def run_lengths(alpha: float, factors: Sequence[float]) -> list[float]:
    """Expected committed tokens of one row at K = 0, 1, …, len(factors): the target's
    own token plus each draft token accepted with every one before it, the acceptance
    at position j being ``alpha`` times ``factors[j]`` (at most 1)."""
    lengths, reach = [1.0], 1.0
    for factor in factors:
        reach *= min(1.0, alpha * factor)
        lengths.append(lengths[-1] + reach)
    return lengths
