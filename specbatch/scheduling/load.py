"""An instance's load as the admission policy sees it (and as instances report it on the wire)."""

from __future__ import annotations

import math
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
    span (differences of totals) rather than from an offline run."""

    steps: tuple[int, ...] = ()
    row_steps: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()
    prefill_tokens: tuple[int, ...] = ()
    seconds: tuple[float, ...] = ()


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
    lookahead: int = 0
    # decode steps so far per K (index = K, 0 = plain) and row-steps per tokens a row
    # committed in one step (index = tokens): where speculation switched itself off
    lookahead_steps: tuple[int, ...] = ()
    tokens_per_row_step: tuple[int, ...] = ()
    batch_steps: BatchStepTotals = field(default_factory=BatchStepTotals)
    preemptions: int = 0
    max_rows: int = 64
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
