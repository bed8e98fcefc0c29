"""How many tokens the draft proposes per step (K), three ways.

- ``goodput`` (the default, after SmartSpec, arXiv 2406.14066): pick the K in 0..8 that
  maximises expected committed tokens per second for the batch that is running, from
  each row's measured acceptance α and the measured costs of a draft pass c(B) and a
  verify pass v(B, K) at that batch size. K = 0 is plain target decoding, so under load
  (where verify costs grow with K) speculation switches itself off instead of slowing
  the server down.
- ``adaptive_rule`` (the seed system's rule): over a rolling window of steps, acceptance
  above 0.75 grows K by 2, above 0.60 by 1, above 0.40 keeps it, above 0.25 shrinks it
  by 1, otherwise by 2; always within [1, 8].
- a fixed K.

One K per step: with rows padded to the step's K, a row drafting fewer tokens saves
no compute, and expected committed tokens grow with K for every α, so every row
should use the step's K (per-row K only pays when the pass cost follows per-row K).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from specbatch.decoding.costs import PassCosts

MIN_LOOKAHEAD = 1
MAX_LOOKAHEAD = 8
# Speculate only when the model predicts at least this gain over plain decoding: the
# cost model is an estimate, and plain decoding is the safe side of a close call.
GOODPUT_MARGIN = 1.03
# A lagging draft is caught up (a prefill of what it missed) only when the time the row
# is expected to save by speculating is this many times the catch-up pass.
CATCH_UP_MARGIN = 2.0


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


def expected_tokens(alpha: float, lookahead: int, remaining: int) -> float:
    """Tokens a row commits in one step with K = ``lookahead`` when each draft token is
    accepted with probability ``alpha``: 1 + α + … + α^K, capped by its budget."""
    return sum(alpha**i for i in range(min(lookahead, max(remaining, 1) - 1) + 1))


@dataclass(frozen=True)
class BatchShape:
    """What the choice of K looks at: per row acceptance and tokens left, and the
    longest row's length (every row of a pass reads that span)."""

    alphas: Sequence[float]
    remaining: Sequence[int]
    span: int


class LookaheadPolicy(Protocol):
    """What the engine asks of a lookahead policy each step."""

    name: str
    k: int  # the K of the last choice

    def choose(self, batch: BatchShape) -> int: ...

    def record(self, drafted: int, accepted: int) -> None: ...

    def catch_up_pays(self, remaining: int, lag: int, span: int) -> bool: ...


class FixedLookahead:
    name = "fixed"

    def __init__(self, k: int) -> None:
        if not 0 <= k <= MAX_LOOKAHEAD:
            raise ValueError(f"lookahead must be within [0, {MAX_LOOKAHEAD}], got {k}")
        self.k = k

    def choose(self, batch: BatchShape) -> int:
        return self.k

    def record(self, drafted: int, accepted: int) -> None:
        """A fixed K ignores acceptance."""

    def catch_up_pays(self, remaining: int, lag: int, span: int) -> bool:
        return self.k > 0


class RuleLookahead:
    """The seed system's rolling-window rule (``lookahead=adaptive_rule``)."""

    name = "adaptive_rule"

    def __init__(self, initial: int = 4, window: int = 4) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.k = initial
        self._window: deque[tuple[int, int]] = deque(maxlen=window)

    def choose(self, batch: BatchShape) -> int:
        return self.k

    def record(self, drafted: int, accepted: int) -> None:
        """Feed one step's batch totals; K moves by the rule on the window's rate."""
        if drafted <= 0:
            return
        self._window.append((drafted, accepted))
        total_drafted = sum(d for d, _ in self._window)
        total_accepted = sum(a for _, a in self._window)
        self.k = next_lookahead(self.k, total_accepted / total_drafted)

    def catch_up_pays(self, remaining: int, lag: int, span: int) -> bool:
        return self.k > 0


class GoodputLookahead:
    """K by expected committed tokens per second (``lookahead=goodput``).

    ``costs`` holds the fitted models of a target pass, a draft pass and the rest of a
    speculative or plain step (``step_speculative``, ``step_plain``: building inputs,
    sampling, verification), which favours fewer, longer steps when it is large."""

    name = "goodput"

    def __init__(self, costs: dict[str, PassCosts]) -> None:
        self.target_costs = costs["target"]
        self.draft_costs = costs["draft"]
        self.step_costs = {True: costs["step_speculative"], False: costs["step_plain"]}
        self.k = 0
        self.saving_per_token = 0.0  # seconds per committed token the last choice saves

    def goodput(self, batch: BatchShape, lookahead: int) -> float:
        """Predicted committed tokens per second of one step with K = ``lookahead``."""
        rows, span = len(batch.alphas), batch.span
        overhead = self.step_costs[lookahead > 0].predict(rows, 0, 0)
        if lookahead == 0:
            seconds = self.target_costs.predict(rows, rows * span, rows * span) + overhead
            return rows / seconds if seconds > 0 else float("inf")
        committed = sum(
            expected_tokens(a, lookahead, r) for a, r in zip(batch.alphas, batch.remaining, strict=True)
        )
        draft_pass = self.draft_costs.predict(rows, rows * (span + lookahead), rows * (span + lookahead))
        verify_span = span + lookahead
        verify_pass = self.target_costs.predict(
            rows * (lookahead + 1), rows * verify_span, rows * (lookahead + 1) * verify_span
        )
        seconds = lookahead * draft_pass + verify_pass + overhead
        return committed / seconds if seconds > 0 else float("inf")

    def choose(self, batch: BatchShape) -> int:
        if not batch.alphas:
            return 0
        plain = self.goodput(batch, 0)
        best_k, best = 0, plain * GOODPUT_MARGIN
        for k in range(MIN_LOOKAHEAD, MAX_LOOKAHEAD + 1):
            value = self.goodput(batch, k)
            if value > best:
                best_k, best = k, value
        self.k = best_k
        self.saving_per_token = 1 / plain - 1 / best if best_k and 0 < plain < float("inf") else 0.0
        return best_k

    def record(self, drafted: int, accepted: int) -> None:
        """Acceptance is tracked per row by the engine; the choice reads it from the batch."""

    def catch_up_pays(self, remaining: int, lag: int, span: int) -> bool:
        """Whether feeding the draft the ``lag`` tokens it missed is repaid by the time
        the row's ``remaining`` tokens save by speculating."""
        if self.saving_per_token <= 0:
            return False
        cost = self.draft_costs.predict(lag, span, lag * span)
        return self.saving_per_token * remaining > CATCH_UP_MARGIN * cost


def make_lookahead(setting: int | str, costs: dict[str, PassCosts]) -> LookaheadPolicy:
    """``goodput``, ``adaptive_rule`` or a fixed K (an int or its string)."""
    if isinstance(setting, str) and not setting.strip().isdigit():
        if setting == "goodput":
            return GoodputLookahead(costs)
        if setting in ("adaptive_rule", "adaptive"):
            return RuleLookahead()
        raise ValueError(f"lookahead must be 'goodput', 'adaptive_rule' or a K in 0..8, got {setting!r}")
    return FixedLookahead(int(setting))
