"""What an instance's KV cache will hold as its rows grow and leave: b_mem's arithmetic.

Each row holds its prompt and the tokens it generated so far, grows by about a token a
step, and frees everything when it ends. Algorithm 1 of Pang et al. sums every row's
final size (prompt plus predicted output) and admits while that sum, with a margin on
the prediction error, fits the cache (``KV_RESERVATIONS`` ``"ends"``): right for a static
batch, whose rows all hold their memory until the longest ends. In a continuous batch
the rows end at different steps, and a short row's blocks are free again long before a
long row reaches its end; the sum of final sizes then counts memory that is never held
at once, and refuses rows a first-come batcher would run without a preemption.
``"peak"`` counts what is held at the worst step instead: every row advancing a token a
step from what it holds now, leaving at its predicted end (LightLLM's past-future
admission carries the same idea). The peak comes at a step where a row leaves, so it is
the largest, over the rows in the order they end, of what the rows still running hold
then. Where the peak leaves no room for the slots a speculative step grows each row by,
the engine steps plain (``lookahead_slots`` in the instance's load): each row counts
with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KV_RESERVATIONS = ("ends", "peak")


@dataclass(frozen=True)
class KvRow:
    """A row as b_mem counts it: tokens it holds now and tokens it is predicted to add."""

    held: float
    remaining: float


@dataclass
class KvPlan:
    """An instance's KV cache as admission plans it: its size in tokens, tokens held by
    no row admission tracks (cached prefixes), and its rows. Each running row takes
    ``row_slack_tokens`` more than its tokens: the rest of its last block, and the slots
    a speculative step grows it by before it knows how many it keeps."""

    total_tokens: float
    other_tokens: float
    row_slack_tokens: float = 0.0
    rows: list[KvRow] = field(default_factory=list)

    def peak_tokens(self, extra: tuple[KvRow, ...] = ()) -> float:
        """The most tokens held at any step from now, with ``extra`` rows started now."""
        rows = sorted((*self.rows, *extra), key=lambda row: row.remaining)
        held = sum(row.held for row in rows)
        running = len(rows)
        peak = 0.0
        for row in rows:
            peak = max(peak, held + running * (row.remaining + self.row_slack_tokens))
            held -= row.held
            running -= 1
        return self.other_tokens + peak

    def fits(self, rows: tuple[KvRow, ...], margin: float) -> bool:
        """Whether ``rows`` started now keep the peak, plus ``margin``, within the cache."""
        return self.peak_tokens(rows) + margin <= self.total_tokens

    def take(self, row: KvRow) -> None:
        self.rows.append(row)
