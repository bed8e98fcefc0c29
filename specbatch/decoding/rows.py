"""Per-row state of the continuous engine, and how results reach their owner.

A row keeps everything that was a column of a rebuilt batch object before:
committed tokens, how much of them each model has cached, its block table, sampling
settings and key, stop rules, counters and deadline. A step gathers the rows it runs
into tensors and writes their new state back, so rows can join and leave between any
two steps and a row that leaves costs nothing from the next step on.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from specbatch.decoding.requests import GenerationRequest, GenerationResult
from specbatch.decoding.stopping import RowOutput
from specbatch.logprobs import TokenLogprob

MODES = ("speculative", "target_only", "draft_only")

# Weight (in draft tokens) of a fresh instance's guessed acceptance, and the decay of
# the instance-wide counts per speculative step (about 200 steps of memory: a K chosen
# on the acceptance of the last few dozen steps is chosen on their luck).
ALPHA_PRIOR_WEIGHT = 4.0
ALPHA_DECAY = 0.995
# Weight (in draft tokens) of the instance-wide acceptance in a row's estimate: until
# ROWS_MEASURED rows with ROW_TRIALS_MIN verified draft tokens or more have ended,
# ROW_PRIOR_WEIGHT_START (rows whose acceptance differs by about ±0.07); then measured
# on the latest ROWS_REMEMBERED of them, within [ALPHA_PRIOR_WEIGHT,
# ROW_PRIOR_WEIGHT_MAX]: at the most, a row's own count weighs half once it has
# drafted that many tokens.
ROW_PRIOR_WEIGHT_START = 16.0
ROW_PRIOR_WEIGHT_MAX = 100.0
ROWS_REMEMBERED = 64
ROWS_MEASURED = 8
ROW_TRIALS_MIN = 8


class RowSink(Protocol):
    """Where a row's tokens and result go. One sink may own many rows (a request of
    several prompts): each engine step calls ``on_tokens`` once per sink with every
    row of it that got tokens, then ``on_finished`` per finished row."""

    def on_tokens(self, updates: dict[int, list[int]]) -> None: ...

    def on_finished(self, key: int, result: GenerationResult) -> None: ...


_row_ids = itertools.count()


@dataclass(eq=False)
class RowHandle:
    """What a caller holds for a submitted row: cancel it, or read its result."""

    row_id: int = field(default_factory=lambda: next(_row_ids))
    # a row that reports log-probabilities: those of its output so far, one per token the
    # sink has been handed (the engine appends before ``on_tokens``), for a streaming sink
    # to send with each delta; read it on the engine's thread, in ``on_tokens``
    logprobs: list[TokenLogprob] | None = None


@dataclass(eq=False)
class Row:
    handle: RowHandle
    request: GenerationRequest
    mode: str
    tokens: list[int]  # prompt + output, committed
    prompt_length: int
    output: RowOutput
    seed: int
    sink: RowSink
    key: int
    blocks: list[int] = field(default_factory=list)
    target_cached: int = 0  # leading tokens whose keys/values the target store holds
    draft_cached: int = 0
    # names of the full blocks of ``tokens`` (the prefix cache's hash chain), and per
    # model how many leading blocks the cache has been told this row wrote
    block_digests: list[bytes] = field(default_factory=list)
    reported_blocks: dict[str, int] = field(default_factory=lambda: {"target": 0, "draft": 0})
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    preemptions: int = 0
    # tokens its draft had to be fed when it was last admitted (its prompt, less what the
    # prefix cache held): what the row cost its draft if admitted while speculating
    draft_feed: int = 0
    # admitted while the policy decoded plain yet wanted newcomers' drafts fed: the draft
    # is fed the prompt all the same, until it first catches up
    draft_wanted: bool = False
    submitted_at: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    # the log-probabilities of the tokens the last step committed, for a row that
    # reports them (the runner writes them, delivery takes them)
    new_logprobs: list[TokenLogprob] = field(default_factory=list)

    @property
    def greedy(self) -> bool:
        return self.request.temperature == 0

    @property
    def coupled(self) -> bool:
        """Seeded sampled rows draw by Gumbel coupling (reproducible under any K)."""
        return self.request.seed is not None and not self.greedy

    @property
    def seq_len(self) -> int:
        return len(self.tokens)

    @property
    def remaining(self) -> int:
        return self.output.max_new_tokens - len(self.output.tokens)

    @property
    def primary(self) -> str:
        """The model that decodes this row on its own (and verifies, when it speculates)."""
        return "draft" if self.mode == "draft_only" else "target"

    @property
    def primary_cached(self) -> int:
        """Cached tokens of the model that decodes this row on its own."""
        return self.cached(self.primary)

    def cached(self, model: str) -> int:
        """Leading tokens whose keys/values ``model``'s store holds for this row."""
        return self.draft_cached if model == "draft" else self.target_cached

    def set_cached(self, model: str, tokens: int) -> None:
        if model == "draft":
            self.draft_cached = tokens
        else:
            self.target_cached = tokens

    def prefilled(self) -> bool:
        """The decoding model holds every token but the pending last one."""
        return self.primary_cached >= self.seq_len - 1

    def alpha(self, prior: float, weight: float) -> float:
        """Acceptance estimate: accepted / (accepted + rejections), the maximum-likelihood
        α of a geometric run, shrunk towards the instance-wide ``prior`` with the weight
        of ``weight`` draft tokens."""
        return (self.accepted + weight * prior) / (self.accepted + self.rejections + weight)

    def result(self) -> GenerationResult:
        out = self.output
        return GenerationResult(
            tokens=list(out.tokens),
            text=out.text or "",
            finish_reason=out.finish_reason or "length",
            num_input_tokens=self.prompt_length,
            num_output_tokens=len(out.tokens),
            total_draft_tokens=self.drafted,
            total_accepted_draft_tokens=self.accepted,
            preemptions=self.preemptions,
            logprobs=None if out.logprobs is None else list(out.logprobs),
        )


class AcceptanceTracker:
    """Instance-wide acceptance, decayed per speculative step: the prior for rows that
    have not speculated yet. It starts at 0.6 from four draft tokens' worth of belief.

    It also says how much a row's own few draft tokens should move its estimate off
    that prior (``row_prior_weight``), from how far the acceptance of ended rows spread
    beyond what their counts alone explain (empirical Bayes, a beta-binomial's method
    of moments). Where rows really differ (code against chat), a row's own count
    soon dominates; where they do not, a row's estimate after a few lucky or unlucky
    steps is mostly luck, and a K chosen on it is chosen on luck: long Ks right after
    a lucky run (which then delivers less), plain decoding after an unlucky one (which
    then never speculates again to learn better)."""

    def __init__(self, initial: float = 0.6) -> None:
        self._accepted = initial * ALPHA_PRIOR_WEIGHT
        self._trials = ALPHA_PRIOR_WEIGHT
        self._ended: deque[tuple[int, int]] = deque(maxlen=ROWS_REMEMBERED)
        self.row_prior_weight = ROW_PRIOR_WEIGHT_START

    @property
    def alpha(self) -> float:
        return self._accepted / self._trials

    @property
    def optimistic_alpha(self) -> float:
        """α plus two standard errors of its estimate. A K is only ever judged by the
        acceptance speculating measures, so a fresh instance (or one unlucky first
        step) that guessed low would never speculate and never learn otherwise; the
        optimism shrinks as draft tokens are measured, and what each K then delivers
        corrects the rest (:mod:`specbatch.decoding.realised`)."""
        alpha = self.alpha
        return min(1.0, alpha + 2.0 * math.sqrt(alpha * (1.0 - alpha) / self._trials))

    def record(self, accepted: int, rejections: int) -> None:
        self._accepted = self._accepted * ALPHA_DECAY + accepted
        self._trials = self._trials * ALPHA_DECAY + accepted + rejections

    def row_ended(self, accepted: int, rejections: int) -> None:
        """A row's whole count, once it ends: evidence of how far rows differ."""
        if accepted + rejections < ROW_TRIALS_MIN:
            return
        self._ended.append((accepted, accepted + rejections))
        if len(self._ended) >= ROWS_MEASURED:
            self.row_prior_weight = row_prior_weight(self._ended)


def row_prior_weight(rows: Sequence[tuple[int, int]]) -> float:
    """The prior weight, in draft tokens, that rows with these (accepted, trials) counts
    imply: their acceptance spread between rows τ² is what their observed spread
    exceeds the binomial spread of their counts by, and a beta prior of weight
    α(1 − α)/τ² − 1 has that spread. Within [ALPHA_PRIOR_WEIGHT, ROW_PRIOR_WEIGHT_MAX]."""
    mean = sum(a for a, _ in rows) / sum(n for _, n in rows)
    observed = statistics.variance([a / n for a, n in rows])
    counting = statistics.fmean(mean * (1.0 - mean) / n for _, n in rows)
    between = observed - counting
    if between <= 0.0:
        return ROW_PRIOR_WEIGHT_MAX
    weight = mean * (1.0 - mean) / between - 1.0
    return min(ROW_PRIOR_WEIGHT_MAX, max(ALPHA_PRIOR_WEIGHT, weight))
