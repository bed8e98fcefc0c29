"""An instance's load as the admission policy sees it (and as instances report it on the wire)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

# Upper bounds (rows) of the buckets; the last one takes every larger batch.
STEP_BATCH_BOUNDS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
STEP_BATCH_LABELS: tuple[str, ...] = (*(str(b) for b in STEP_BATCH_BOUNDS), "+Inf")


def step_batch_bucket(rows: int) -> int:
    """Index of the bucket a step over ``rows`` rows counts in."""
    if rows <= 1:
        return 0
    return min(math.ceil(math.log2(rows)), len(STEP_BATCH_BOUNDS))


@dataclass(frozen=True)
class BatchStepTotals:
    """An engine's steps that committed tokens, totalled per batch-size bucket (index as
    in :data:`STEP_BATCH_LABELS`) since it started: how many, their rows (row-steps), the
    tokens rows committed, the prompt tokens prefilled in the same iterations (prompts
    and draft catch-up), and the iterations' seconds (summed, ``step_seconds_total``).

    A step's seconds grow with its rows, and the K the policy picks (so the tokens a row
    commits) moves with them: one total over all steps hides both. Per bucket, a
    dashboard shows step time against batch size and where speculation pays, and a
    simulator fits the shape of a step's cost from a live server's counters over any
    span (differences of totals) rather than from an offline run. The steps that
    prefilled nothing also count their squared seconds, so that the spread of a step's
    time about its mean (a shared host's irregular steps) is read over any span too
    (:func:`decode_step_cv`). ``context_slots`` counts the KV slots the steps' attention
    read, every row padded to the longest context of its step (rows x that context): one
    long row makes a step of short ones several times dearer (16 rows at ~32 tokens of
    context 8.6 ms, the same with one row at ~768 43.6 ms on the 2-core CPU), which rows
    and tokens alone do not show."""

    steps: tuple[int, ...] = ()
    row_steps: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()
    prefill_tokens: tuple[int, ...] = ()
    seconds: tuple[float, ...] = ()
    # the steps that prefilled nothing, their seconds and their squared seconds: how
    # irregular a step of one size is on this host, with no prompt's cost in the spread
    decode_steps: tuple[int, ...] = ()
    decode_seconds: tuple[float, ...] = ()
    decode_seconds_squared: tuple[float, ...] = ()
    context_slots: tuple[int, ...] = ()

    def row_step_s(self, prefill_s_per_token: float) -> float | None:
        """Seconds one more row adds to a step: the slope of a step's seconds (less its
        prompt tokens at ``prefill_s_per_token``) on its rows, fitted over the buckets'
        means weighted by their steps, and no more than a row-step's mean share (a slope
        above it would give a step a negative fixed cost). None where the counters cannot
        say: fewer than two batch sizes measured, or seconds that do not grow with rows.
        A row started beside running ones delays each of them by this much a step, not
        by the whole seconds of a step: on small batches most of a step is the pass's
        fixed cost (reading the weights), which the rows already pay."""
        buckets = [
            (row_steps / steps, (seconds - prefill * prefill_s_per_token) / steps, steps)
            for steps, row_steps, prefill, seconds in zip(
                self.steps, self.row_steps, self.prefill_tokens, self.seconds, strict=True
            )
            if steps > 0
        ]
        if len(buckets) < 2:
            return None
        weight = sum(w for _, _, w in buckets)
        mean_rows = sum(x * w for x, _, w in buckets) / weight
        mean_s = sum(y * w for _, y, w in buckets) / weight
        spread = sum(w * (x - mean_rows) ** 2 for x, _, w in buckets)
        if spread <= 0:
            return None
        slope = sum(w * (x - mean_rows) * (y - mean_s) for x, y, w in buckets) / spread
        if slope <= 0:
            return None
        return min(slope, mean_s / mean_rows)

    def mean_step_s(self, rows: int) -> float | None:
        """Mean seconds of a committing step over ``rows`` rows (the bucket it counts in),
        since the engine started; None before a step of that size ran. Set against the
        instance's cycle now, it says how much slower than usual the host runs a step of
        that size at this moment."""
        index = step_batch_bucket(rows)
        if index >= len(self.steps) or self.steps[index] == 0:
            return None
        return self.seconds[index] / self.steps[index]

    @property
    def committed_steps(self) -> int:
        """Steps that committed tokens since the engine started, every batch size."""
        return sum(self.steps)

    @property
    def tokens_per_row_step(self) -> float:
        """Tokens a row commits in a step, over every step counted (1 before any)."""
        row_steps = sum(self.row_steps)
        return sum(self.tokens) / row_steps if row_steps else 1.0


class BatchStepCounter:
    """Counts each committing step into its bucket: an engine's, or a simulated instance's."""

    def __init__(self) -> None:
        size = len(STEP_BATCH_LABELS)
        self._steps = [0] * size
        self._row_steps = [0] * size
        self._tokens = [0] * size
        self._prefill = [0] * size
        self._seconds = [0.0] * size
        self._decode_steps = [0] * size
        self._decode_seconds = [0.0] * size
        self._decode_squared = [0.0] * size
        self._context_slots = [0] * size

    def record(
        self, rows: int, tokens: int, prefill_tokens: int, seconds: float, context_slots: int = 0
    ) -> None:
        index = step_batch_bucket(rows)
        self._context_slots[index] += context_slots
        self._steps[index] += 1
        self._row_steps[index] += rows
        self._tokens[index] += tokens
        self._prefill[index] += prefill_tokens
        self._seconds[index] += seconds
        if prefill_tokens == 0:
            self._decode_steps[index] += 1
            self._decode_seconds[index] += seconds
            self._decode_squared[index] += seconds * seconds

    def totals(self) -> BatchStepTotals:
        return BatchStepTotals(
            tuple(self._steps),
            tuple(self._row_steps),
            tuple(self._tokens),
            tuple(self._prefill),
            tuple(self._seconds),
            tuple(self._decode_steps),
            tuple(self._decode_seconds),
            tuple(self._decode_squared),
            tuple(self._context_slots),
        )


def decode_step_cv(
    steps: Sequence[float], seconds: Sequence[float], squared: Sequence[float], min_steps: int = 10
) -> float | None:
    """The coefficient of variation of a step's seconds about its batch size's mean, over
    the steps that prefilled nothing: per bucket of at least ``min_steps`` such steps,
    weighted by its steps; None where no bucket has that many. It reads the steps the
    totals hold: several instances' steps pooled (their totals summed), or a span's
    (differences of totals)."""
    weighted = total = 0.0
    for count, summed, summed_squares in zip(steps, seconds, squared, strict=True):
        if count < min_steps or summed <= 0:
            continue
        mean = summed / count
        variance = max(0.0, summed_squares / count - mean * mean)
        weighted += count * math.sqrt(variance) / mean
        total += count
    return weighted / total if total else None


@dataclass(frozen=True)
class InstanceLoad:
    """An instance's state as its engine last measured it; the admission policy reads it."""

    running: int = 0
    waiting: int = 0
    blocks_total: int = 0
    blocks_free: int = 0
    block_size: int = 16
    step_seconds: float = 0.0
    # seconds spent in steps that committed tokens, since the engine started: with the
    # step and row-step counts below, what a step really cost over any span (a simulator
    # calibrated on it runs at the machine's speed of that span)
    step_seconds_total: float = 0.0
    # wall seconds from one committing step's end to the next while rows ran: the steps
    # plus what stalls the rows between them (scoring passes, the loop's own work)
    cycle_seconds_total: float = 0.0
    # seconds a running row waits for each token it commits: a cycle over the tokens a
    # row commits per step (what b_SLA holds to its pace and admission prices rows at)
    seconds_per_token: float = 0.0
    # the weight each committing step's cycle gets in seconds_per_token (1: the last step
    # alone): how many steps a row started now takes to show in that pace
    pace_smoothing: float = 1.0
    lookahead: int = 0
    # decode steps so far per K (index = K, 0 = plain) and row-steps per tokens a row
    # committed in one step (index = tokens): where speculation switched itself off
    lookahead_steps: tuple[int, ...] = ()
    tokens_per_row_step: tuple[int, ...] = ()
    batch_steps: BatchStepTotals = field(default_factory=BatchStepTotals)
    preemptions: int = 0
    # decode steps run plain although the policy chose K > 0: the pool had no room for
    # the lookahead's slots (what a KV budget filled to its rows' ends costs speculation)
    lookahead_cut_steps: int = 0
    max_rows: int = 64
    # slots past its tokens a row is grown by for a speculative step (the largest K): the
    # KV room speculation needs beside the tokens themselves; without it the step is plain
    lookahead_slots: int = 0
    # seconds one prompt token costs to prefill (0 until measured): admission counts
    # prompt-heavy work in what it costs, not in rows
    prefill_seconds_per_token: float = 0.0
    # the engine's prefix cache, counted since it started: prompt tokens found cached and
    # computed at admission, named blocks (held or evictable), evictable ones, evictions
    prefix_hit_tokens: int = 0
    prefix_miss_tokens: int = 0
    cached_blocks: int = 0
    evictable_blocks: int = 0
    evictions: int = 0

    @property
    def free_tokens(self) -> int:
        return self.blocks_free * self.block_size

    @property
    def total_tokens(self) -> int:
        return self.blocks_total * self.block_size

    @property
    def held_tokens(self) -> int:
        return (self.blocks_total - self.blocks_free) * self.block_size
