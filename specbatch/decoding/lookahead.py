"""How many tokens the draft proposes per step (K), three ways.

- ``goodput`` (the default, after SmartSpec, arXiv 2406.14066): pick the K in 0..8 that
  maximises committed tokens per second for the batch that is running. The prediction
  comes from each row's measured acceptance α (shrunk towards the instance's as far as
  rows are seen to differ: :class:`specbatch.decoding.rows.AcceptanceTracker`) and the
  fitted costs of a draft pass c(B) and a verify pass v(B, K) at that batch size (at
  the padded shapes the step runs), plus what a step costs besides its passes, the
  engine's iteration around it included (admitting, choosing K, delivering: paid once
  a step whatever it commits, so it favours fewer, longer steps); what each K then
  actually delivered corrects it (:mod:`specbatch.decoding.realised`).
  K = 0 is plain target decoding and always a candidate, so where speculation does
  not pay (low acceptance, or under load where verify costs grow with K) it switches
  itself off instead of slowing the server down. The draft is fed only while the
  policy speculates, so switching speculation on first catches the lagging drafts up:
  that prefill is priced into each K > 0 when it is chosen, spread over the tokens it
  lets the rows speculate, and forgotten once paid (a sunk cost says nothing of which
  K is best next). A row admitted while the policy speculates has its draft fed its
  prompt before any choice sees it: a standing cost of speculating, priced into each
  K > 0 per token it commits from the rows that joined lately (their drafts' prompts
  over the tokens they ask for: :class:`DraftFeeds`). It is priced,
  not learnt from the steps: charged to the speculative steps after a burst of
  arrivals, it read as every K costing 1.5-2.1x its prediction for the first few steps
  (a90, 16 rows), and the policy decoded plain through the burst while the lags grew.
  While it decodes plain only because the lagging drafts' catch-up would not repay
  itself, and a K that has run at that batch size would pay were they caught up (where
  no K ever has, the cost model says so), the drafts of rows admitted then are fed their
  prompts all the same (``feeds_drafts``), and so are those admitted after a plain
  choice made only because the rows were about to finish (a row with one token left
  cannot use a K; its successor can):
  in a steady stream every row would otherwise join lagging by its whole prompt, older
  rows by all they have decoded too, and the catch-up that switching on costs would
  never shrink.
  A choice is held for a few steps of the same rows without pricing the Ks again:
  pricing nine Ks costs a few per cent of a step at one row, while what the choice
  rests on moves little in a few steps (a plain step moves no acceptance at all; a
  speculative one moves each row's estimate by a few draft tokens of evidence). A probe
  (a K chosen for its optimism bonus rather than its corrected goodput) is never held,
  nor a K that has run too few steps for its correction to rest on. While it
  speculates, plain decoding's price is refreshed by one plain step once its evidence at
  that batch size has faded: that price is a correction measured when plain decoding
  last ran, and goes stale as the machine's speed drifts.
- ``adaptive_rule`` (the seed system's rule): over a rolling window of steps, acceptance
  above 0.75 grows K by 2, above 0.60 by 1, above 0.40 keeps it, above 0.25 shrinks it
  by 1, otherwise by 2; always within [1, 8].
- a fixed K.

One K per step: with rows padded to the step's K, a row drafting fewer tokens saves
no compute, and expected committed tokens grow with K for every α, so every row
should use the step's K (per-row K only pays when the pass cost follows per-row K).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from specbatch.decoding.costs import PassCosts
from specbatch.decoding.realised import RealisedGoodput

MIN_LOOKAHEAD = 1
MAX_LOOKAHEAD = 8
# Speculate only when the corrected goodput is at least this gain over plain decoding:
# plain decoding is the safe side of a close call.
GOODPUT_MARGIN = 1.01
# A choice is held without a new choice for this many steps of the same rows. A choice
# prices nine Ks (about 0.27 ms on this CPU, 3 % of a one-row plain step, 2 % of a
# speculative one), and while the same rows decode the answer seldom changes within a
# few steps; a probe the optimism bonus would have made comes at most this many steps
# late. A row joining or leaving ends the hold: a row about to finish cannot repay
# speculation, the row that takes its place can, and a newcomer's draft may lag.
HOLD_STEPS = 8
# A speculative choice is held only once its K has run this many (discounted) steps at
# this batch size: a K chosen on the cost model's word alone may be far off, and its
# first steps are what correct it.
HOLD_EVIDENCE_STEPS = 4.0
# The optimism of the acceptance bound (a fresh engine's reason to probe) weighs in a
# K's score as much as this many speculative steps at the batch size weigh against it:
# where speculation has run, its steps, not the bound, say what a K delivers.
OPTIMISM_STEPS = 4.0
# While the policy speculates, plain decoding runs one step (a refresh) whenever its
# evidence at this batch size has faded below PLAIN_REFRESH_STEPS discounted steps and
# the speculative Ks' holds at least SPECULATIVE_STEPS_BEFORE_REFRESH: about once every
# 280-440 speculative steps of a batch size, a fraction of a per cent of them.
PLAIN_REFRESH_STEPS = 0.5
SPECULATIVE_STEPS_BEFORE_REFRESH = 50.0
# Feeding newcomers' drafts is priced over the rows that joined lately: each newcomer
# weighs FEED_DISCOUNT of the one after it (about the last thirty rows).
FEED_DISCOUNT = 0.97


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
    terms = min(lookahead, max(remaining, 1) - 1) + 1
    return terms if alpha >= 1.0 else (1.0 - alpha**terms) / (1.0 - alpha)


@dataclass(frozen=True)
class BatchShape:
    """What the choice of K looks at: per row acceptance and tokens left, the longest
    row's length (every row of a pass reads that span), per row the tokens its draft
    must be fed before it can speculate (empty: no draft lags), the rows' ids, which
    tell a batch of the same rows from a new one (empty: never the same rows), and per
    row the tokens its draft was fed on admission and the tokens it asks for in all
    (empty: a newcomer's draft costs nothing).

    ``alphas`` lean optimistic (a row with little evidence of its own leans towards an
    upper bound of the instance's acceptance), so a fresh engine probes speculation;
    ``measured_alphas`` lean towards the instance's measured acceptance instead (empty:
    as ``alphas``). Goodput is priced, and what a step delivered judged, at the
    measured ones; the optimism only raises a K's score as a probe (see
    :meth:`GoodputLookahead.choose`)."""

    alphas: Sequence[float]
    remaining: Sequence[int]
    span: int
    lags: Sequence[int] = ()
    rows: Sequence[int] = ()
    feeds: Sequence[int] = ()
    requested: Sequence[int] = ()
    measured_alphas: Sequence[float] = ()


@dataclass(frozen=True)
class StepOutcome:
    """What one decode step delivered for the rows that ran it with K = ``lookahead``
    (0: a plain step): the batch they formed, the draft tokens proposed and accepted,
    the tokens committed and the seconds the step's passes took. The ``beside`` rows
    (a lagging draft, a target-only request), as they stood before the step, ran a
    plain pass beside the speculative ones, one token each, counted in ``committed``
    and their pass in ``seconds``."""

    lookahead: int
    batch: BatchShape
    drafted: int
    accepted: int
    committed: int
    seconds: float
    beside: BatchShape | None = None

    @property
    def plain_beside(self) -> int:
        """How many rows ran the plain pass beside the speculative ones."""
        return len(self.beside.alphas) if self.beside is not None else 0


def iteration_costs_name(lookahead: int) -> str:
    """The cost model of the engine's iteration around a step with K = ``lookahead``.
    Speculative and plain iterations are learnt apart, as their steps' own overheads
    are: a speculative one delivers runs of tokens and prices the Ks more often (a plain
    choice is held from its first step, a K only once it has run a few), and one model
    fitted on a long run of one kind would price the other as that kind (a few per cent
    of a one-row plain step, the size of the choices at stake).
    """
    return "iteration_speculative" if lookahead > 0 else "iteration_plain"


def overhead_seconds(costs: PassCosts, rows: int) -> float:
    """What a step's or an iteration's overhead model predicts for ``rows`` rows, read at
    no more rows than it has seen. It is fitted on the steps of its kind alone, and right
    after start-up those are a handful at one to four rows: extrapolated along their
    slope, three of six fresh engines (a90, warmed on four rows) priced a speculative
    step's overhead at 20 rows at 10-12 ms, against 0.3-1.3 ms for a plain step's and 15 ms
    for a plain pass, a batch size at which no K had run to correct it. Read at the rows
    seen, it errs on the hopeful side, and the first step of that kind at a larger batch
    teaches it."""
    return costs.predict(min(rows, max(1.0, costs.most_tokens)), 0, 0)


class LookaheadPolicy(Protocol):
    """What the engine asks of a lookahead policy each step."""

    name: str
    k: int  # the K of the last choice

    @property
    def feeds_drafts(self) -> bool:
        """Whether the drafts of rows admitted now are fed their prompts, K = 0 or not."""

    def choose(self, batch: BatchShape) -> int: ...

    def record(self, step: StepOutcome) -> None: ...


class FixedLookahead:
    name = "fixed"

    def __init__(self, k: int) -> None:
        if not 0 <= k <= MAX_LOOKAHEAD:
            raise ValueError(f"lookahead must be within [0, {MAX_LOOKAHEAD}], got {k}")
        self.k = k

    @property
    def feeds_drafts(self) -> bool:
        return self.k > 0

    def choose(self, batch: BatchShape) -> int:
        return self.k

    def record(self, step: StepOutcome) -> None:
        """A fixed K ignores what it delivered."""


class RuleLookahead:
    """The seed system's rolling-window rule (``lookahead=adaptive_rule``)."""

    name = "adaptive_rule"

    def __init__(self, initial: int = 4, window: int = 4) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.k = initial
        self._window: deque[tuple[int, int]] = deque(maxlen=window)

    @property
    def feeds_drafts(self) -> bool:
        return self.k > 0

    def choose(self, batch: BatchShape) -> int:
        return self.k

    def record(self, step: StepOutcome) -> None:
        """Feed one step's batch totals; K moves by the rule on the window's rate."""
        if step.drafted <= 0:
            return
        self._window.append((step.drafted, step.accepted))
        total_drafted = sum(d for d, _ in self._window)
        total_accepted = sum(a for _, a in self._window)
        self.k = next_lookahead(self.k, total_accepted / total_drafted)


class DraftFeeds:
    """What feeding newcomers' drafts their prompts costs per token they ask for, over
    the rows that joined lately (each row once, when a batch first holds it). It is the
    workload's, read whatever K runs, so a spell of plain decoding leaves it current; and
    steadier than one batch's own rows, which at the start of a burst of short answers
    to long prompts read 0.4 ms a token where the stream's rows cost 0.05 (a90, 14 rows).
    ``price(fed)`` is the seconds of one draft prefill of ``fed`` tokens."""

    def __init__(self, price: Callable[[int], float]) -> None:
        self._price = price
        self._seconds = 0.0
        self._requested = 0.0
        self._seen: set[int] = set()  # the rows of the last batch observed

    @property
    def seconds_per_token(self) -> float:
        return self._seconds / self._requested if self._requested > 0 else 0.0

    def observe(self, batch: BatchShape) -> None:
        """Take in the rows of ``batch`` not in the last batch observed (every row, where
        the batch names none)."""
        if not batch.feeds:
            return
        ids = batch.rows or [None] * len(batch.feeds)
        for row, fed, requested in zip(ids, batch.feeds, batch.requested, strict=True):
            if row is None or row not in self._seen:
                self._seconds = FEED_DISCOUNT * self._seconds + (self._price(fed) if fed > 0 else 0.0)
                self._requested = FEED_DISCOUNT * self._requested + requested
        self._seen = set(batch.rows)


class GoodputLookahead:
    """K by committed tokens per second (``lookahead=goodput``): predicted, then corrected
    by what each K delivered.

    ``costs`` holds the fitted models of a target pass, a draft pass, the rest of a
    speculative or plain step (``step_speculative``, ``step_plain``: building inputs,
    sampling, verification) and the rest of the engine's iteration around one
    (``iteration_speculative``, ``iteration_plain``: admitting, choosing K, delivering),
    which every K pays once a step; the last two favour fewer, longer steps the larger
    they are.
    ``verify_columns(k)`` is the draft columns a verify pass with K = k runs at (padded
    under compilation) and ``padded_rows(n)`` the rows a pass of n rows runs at, so the
    prediction prices the shape the step really runs; the realised correction prices
    whatever else the padding costs."""

    name = "goodput"

    def __init__(
        self,
        costs: dict[str, PassCosts],
        verify_columns: Callable[[int], int] = lambda k: k,
        padded_rows: Callable[[int], int] = lambda rows: rows,
    ) -> None:
        self.target_costs = costs["target"]
        self.draft_costs = costs["draft"]
        self.step_costs = {True: costs["step_speculative"], False: costs["step_plain"]}
        self.iteration_costs = {k > 0: costs[iteration_costs_name(k)] for k in (0, 1)}
        self.verify_columns = verify_columns
        self.padded_rows = padded_rows
        self.realised = RealisedGoodput()
        self.feeds = DraftFeeds(lambda fed: self.draft_costs.predict(fed, fed, fed * fed))
        self.k = 0
        self.feeds_drafts = False
        self._held = 0  # steps left of the held choice
        self._held_rows: tuple[int, ...] = ()  # the rows it was made for

    def predict(self, batch: BatchShape, lookahead: int) -> tuple[float, float]:
        """Predicted (committed tokens, seconds) of one step with K = ``lookahead``, the
        rest of its iteration included."""
        tokens, seconds = self._step(batch, lookahead)
        return tokens, seconds + overhead_seconds(self.iteration_costs[lookahead > 0], len(batch.alphas))

    def _step(self, batch: BatchShape, lookahead: int) -> tuple[float, float]:
        """Predicted (committed tokens, seconds) of the step's passes and its own
        overhead with K = ``lookahead``, and the catch-up it owes."""
        rows, span = self.padded_rows(len(batch.alphas)), batch.span
        overhead = overhead_seconds(self.step_costs[lookahead > 0], rows)
        if lookahead == 0:
            return len(batch.alphas), self.target_costs.predict(rows, rows * span, rows * span) + overhead
        committed = sum(
            expected_tokens(a, lookahead, r) for a, r in zip(batch.alphas, batch.remaining, strict=True)
        )
        draft_pass = self.draft_costs.predict(rows, rows * (span + lookahead), rows * (span + lookahead))
        verify_span = span + lookahead
        fed = rows * (self.verify_columns(lookahead) + 1)
        verify_pass = self.target_costs.predict(fed, rows * verify_span, fed * verify_span)
        step = lookahead * draft_pass + verify_pass + overhead
        return committed, step + self.switch_seconds(batch, lookahead)

    def predict_step(self, step: StepOutcome) -> tuple[float, float]:
        """Predicted (committed tokens, seconds) of what ``step`` ran: its rows at its K,
        at their measured acceptance (see :meth:`record`), and, beside them, a plain pass
        of the rest (one token each), in one iteration."""
        # a plain step's price does not depend on acceptance: no copy of the batch for it
        batch = at_measured_acceptance(step.batch) if step.lookahead else step.batch
        tokens, seconds = self._step(batch, step.lookahead)
        rows = len(step.batch.alphas) + step.plain_beside
        if step.plain_beside:
            beside_tokens, beside_seconds = self._step(step.beside, 0)
            tokens, seconds = tokens + beside_tokens, seconds + beside_seconds
        return tokens, seconds + overhead_seconds(self.iteration_costs[step.lookahead > 0], rows)

    def switch_seconds(self, batch: BatchShape, lookahead: int) -> float:
        """The draft catch-up that speculating with K = ``lookahead`` needs first, per
        step: one prefill of every lagging draft, each row's share (by tokens fed)
        spread over the tokens it has left at the rate K commits them. A row about to
        finish cannot repay a long catch-up, one with many tokens left can; a row
        whose draft is caught up costs nothing more, whatever its catch-up cost."""
        if lookahead == 0:
            return 0.0
        catch_up = self.catch_up_seconds(batch)
        if catch_up == 0.0:
            return 0.0
        fed = sum(batch.lags)
        return sum(
            catch_up * lag / fed * expected_tokens(alpha, lookahead, remaining) / max(1, remaining)
            for lag, alpha, remaining in zip(batch.lags, batch.alphas, batch.remaining, strict=True)
            if lag > 0
        )

    def catch_up_seconds(self, batch: BatchShape) -> float:
        """A draft prefill of every lagging row's missing tokens (the fitted draft cost
        model): what switching speculation on costs in full, before any step repays it.
        The engine feeds lags in budget-sized chunks, row after row, so a pass pads
        little: priced as the tokens missing. Every row padded to the longest lag, as
        before, priced lags spread over 16-256 tokens (whole prompts, after plain
        decoding) at about twice their tokens: 0.9-1.6 s for 30-32 rows on a90, where
        the engine measured 0.118 ms a token fed."""
        lags = [lag for lag in batch.lags if lag > 0]
        if not lags:
            return 0.0
        fed = sum(lags)
        return self.draft_costs.predict(fed, len(lags) * batch.span, fed * batch.span)

    def corrected(self, batch: BatchShape, lookaheads: Sequence[int]) -> list[tuple[float, float]]:
        """(committed tokens, seconds) of one step with each K of ``lookaheads``: the
        cost model's prediction corrected by what that K delivered at this batch size,
        and for K > 0 the newcomers' draft prefills its tokens stand for (:class:`DraftFeeds`,
        priced by the fitted draft cost model as the engine runs them: one row, its prompt
        at once)."""
        corrections = self.realised.corrections(len(batch.alphas), lookaheads)
        feed = self.feeds.seconds_per_token
        found = []
        for k, (tokens, seconds), (token_factor, time_factor) in zip(
            lookaheads, (self.predict(batch, k) for k in lookaheads), corrections, strict=True
        ):
            tokens *= token_factor
            found.append((tokens, seconds * time_factor + (feed * tokens if k else 0.0)))
        return found

    def goodput(self, batch: BatchShape, lookahead: int) -> float:
        """Corrected committed tokens per second of one step with K = ``lookahead``."""
        [(tokens, seconds)] = self.corrected(batch, [lookahead])
        return tokens / seconds if seconds > 0 else float("inf")

    def choose(self, batch: BatchShape) -> int:
        """The K of the best score: each K's corrected goodput at the rows' measured
        acceptance, raised by the evidence it lacks (the realised bonus) and, while
        speculation has run little at this batch size, by the optimism of the acceptance
        bound (:func:`acceptance_optimism`, weighed as OPTIMISM_STEPS speculative steps
        against theirs); both bonuses divided by what a probe of K costs over a plain
        step, the whole catch-up of lagging drafts included. Undivided, the bound's
        optimism at α ≈ 0.5 and sixteen clients bought a probe priced at 0.91x plain
        decoding that first fed sixteen prompts to the draft (2,747 tokens, seven plain
        steps' time) 2-7 times in each closed loop of 64 requests (about 600 steps)
        after the engine's first. Held only where the best score is also the best
        goodput: a K chosen for its optimism is a probe. The bound never narrows to the
        measured acceptance itself (that is measured on decayed evidence): priced into
        goodput at full weight, as it was, it kept a K that delivers less than plain
        decoding. On the α ≈ 0.5 pair at four clients goodput ran K = 1 on 85-95 % of
        its steps in two rounds of three, and fed newcomers' drafts on its word, at
        0.90x target-only where K = 1 ran 0.93x (medians of the rounds' ratios)."""
        if not batch.alphas:
            return 0
        rows = len(batch.alphas)
        if self._held and batch.rows and tuple(batch.rows) == self._held_rows:
            self._held -= 1
            return self.k
        self.feeds.observe(batch)
        measured = at_measured_acceptance(batch)
        steps = self.corrected(measured, range(MAX_LOOKAHEAD + 1))
        rates = [t / s if s > 0 else float("inf") for t, s in steps]
        plain_seconds = steps[0][1]
        # a probe of K > 0 from plain decoding pays the whole catch-up, not its share
        catch_up = self.catch_up_seconds(batch)
        optimism_weight = OPTIMISM_STEPS / (OPTIMISM_STEPS + self.realised.speculative_steps(rows))
        scores = [
            self.realised.optimistic(
                rows,
                k,
                rate,
                (s + (catch_up if k else 0.0)) / plain_seconds if plain_seconds > 0 else 1.0,
                (acceptance_optimism(batch, k) - 1.0) * optimism_weight,
            )
            for k, (rate, (_, s)) in enumerate(zip(rates, steps, strict=True))
        ]
        best_k = _best(scores)
        if best_k and self._plain_is_stale(rows):
            best_k = 0
        settled = best_k == _best(rates) and (
            best_k == 0 or self.realised.steps(rows, best_k) >= HOLD_EVIDENCE_STEPS
        )
        self._held, self._held_rows = (HOLD_STEPS, tuple(batch.rows)) if settled else (0, ())
        self.k = best_k
        self.feeds_drafts = best_k > 0 or self._newcomer_would_pay(measured, rates[0])
        return best_k

    def _newcomer_would_pay(self, batch: BatchShape, plain_rate: float) -> bool:
        """Whether a row admitted after this plain choice should have its draft fed its
        prompt: whether speculation would pay for ``batch`` were its drafts caught up
        and its rows fresh (no row short of a whole K's tokens). A plain choice over rows
        about to finish says nothing of their successors: a row with one token left
        cannot use a K, the row that takes its place can. Judged on the finishing rows
        as they stood, at one client (a70) 15 of 16 newcomers joined with their drafts
        unfed, each then lagging by its whole prompt, a catch-up that kept goodput plain
        for 86-96 % of its steps. Where nothing lags and no row is finishing, the plain
        choice just made already answers for a newcomer."""
        if not any(batch.lags) and min(batch.remaining) > MAX_LOOKAHEAD:
            return False
        fresh = [max(r, MAX_LOOKAHEAD + 1) for r in batch.remaining]
        return self.pays_caught_up(dataclasses.replace(batch, remaining=fresh), plain_rate)

    def pays_caught_up(self, batch: BatchShape, plain_rate: float) -> bool:
        """Whether some K > 0 would beat plain decoding's corrected goodput (by
        GOODPUT_MARGIN) were every draft of ``batch`` caught up, feeding newcomers' drafts
        included: what a row admitted now, its draft fed its prompt, will gain once the
        lagging rows have left. Where speculation has run at this batch size, only a K
        that has run there (its correction resting on HOLD_EVIDENCE_STEPS steps) counts: a
        gain the cost model predicts and no step has shown is what a probe is for, not a
        reason to feed every newcomer's draft. On the α ≈ 0.5 pair at 16 clients (48
        requests), the prediction alone had drafts fed on 156 of 536 plain choices, 4,161
        draft tokens beside 8,588 of target prefill, for 3 speculative steps. Where no K
        has ever run at this batch size, the cost model's word is all there is, and it is
        taken: without it, a fresh engine thrown into a closed loop at 32 clients (a90)
        met that batch size with every draft lagging and no evidence, never probed a
        catch-up that large, and decoded plain for the whole loop in one run of four,
        at 0.84x fixed K = 3. Fed, the newcomers' drafts make the first speculative step
        there cheap, and from that step on its evidence decides."""
        rows = len(batch.alphas)
        ks = range(MIN_LOOKAHEAD, MAX_LOOKAHEAD + 1)
        measured = [k for k in ks if self.realised.steps(rows, k) >= HOLD_EVIDENCE_STEPS]
        if not measured and self.realised.speculated(rows):
            return False
        steps = self.corrected(dataclasses.replace(batch, lags=()), measured or list(ks))
        return max(t / s if s > 0 else float("inf") for t, s in steps) > plain_rate * GOODPUT_MARGIN

    def _plain_is_stale(self, rows: int) -> bool:
        """Whether plain decoding's price at this batch size rests on evidence too old
        to trust while speculation has run long there. Its corrected price is a ratio of
        realised to predicted seconds measured when it last ran, times what the cost
        model predicts now, so it goes stale as the machine's speed drifts: a closed loop
        at 16 rows (α ≈ 0.5) priced a plain step at 22 ms where the next round's took
        14 ms, and ran K = 1 for a whole round at 0.87x plain decoding, beyond what an
        optimism bonus lifts. A refresh is a probe (never held)."""
        return (
            self.realised.speculative_steps(rows) >= SPECULATIVE_STEPS_BEFORE_REFRESH
            and self.realised.steps(rows, 0) < PLAIN_REFRESH_STEPS
        )

    def record(self, step: StepOutcome) -> None:
        """Compare what the step delivered with what was predicted for it: its
        speculative rows at its K and the plain pass of the rows beside them. Both are
        predicted, so the correction of K holds only what K itself cost more or less
        than predicted; a plain pass beside a few caught-up rows (just after switching
        speculation on) would otherwise read as a K costing many times its prediction
        and lock every K out of that batch size.

        The prediction (:meth:`predict_step`) takes the rows' measured acceptance, not
        the optimistic one a probe was chosen on: judged against that, a fresh engine's
        first steps at a70 with one row (K = 8 on an acceptance bound of 1.0: 9 tokens
        predicted, 2 committed; then K = 6: 5.5 and 2) priced every K at about a quarter
        of its tokens, and goodput decoded plain on 1,836 of the next 1,852 steps, where
        K = 2 ran 1.08x target-only decoding."""
        if not step.batch.alphas:
            return
        self.realised.record(
            len(step.batch.alphas) + step.plain_beside,
            step.lookahead,
            self.predict_step(step),
            (step.committed, step.seconds),
        )


def at_measured_acceptance(batch: BatchShape) -> BatchShape:
    """``batch`` with its rows' measured acceptance as the one goodput is priced at."""
    if not batch.measured_alphas:
        return batch
    return dataclasses.replace(batch, alphas=batch.measured_alphas)


def acceptance_optimism(batch: BatchShape, lookahead: int) -> float:
    """The tokens one step with K = ``lookahead`` commits at the rows' optimistic
    acceptance over those at their measured one: how much more an acceptance bound
    says K could deliver than what has been measured (1 for plain decoding)."""
    if lookahead == 0 or not batch.measured_alphas:
        return 1.0
    optimistic, measured = (
        sum(expected_tokens(a, lookahead, r) for a, r in zip(alphas, batch.remaining, strict=True))
        for alphas in (batch.alphas, batch.measured_alphas)
    )
    return optimistic / measured


def _best(rates: Sequence[float]) -> int:
    """The K of the highest rate; plain decoding (K = 0) unless a K > 0 beats it by
    GOODPUT_MARGIN."""
    best_k, best = 0, rates[0] * GOODPUT_MARGIN
    for k in range(MIN_LOOKAHEAD, MAX_LOOKAHEAD + 1):
        if rates[k] > best:
            best_k, best = k, rates[k]
    return best_k


def make_lookahead(
    setting: int | str,
    costs: dict[str, PassCosts],
    verify_columns: Callable[[int], int] = lambda k: k,
    padded_rows: Callable[[int], int] = lambda rows: rows,
) -> LookaheadPolicy:
    """``goodput``, ``adaptive_rule`` or a fixed K (an int or its string); the shape
    functions are the step runner's padding (see :class:`GoodputLookahead`)."""
    if isinstance(setting, str) and not setting.strip().isdigit():
        if setting == "goodput":
            return GoodputLookahead(costs, verify_columns, padded_rows)
        if setting in ("adaptive_rule", "adaptive"):
            return RuleLookahead()
        raise ValueError(f"lookahead must be 'goodput', 'adaptive_rule' or a K in 0..8, got {setting!r}")
    return FixedLookahead(int(setting))
