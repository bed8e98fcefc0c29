"""Which padded shape a pass runs at.

A compiled graph, and even more a captured CUDA graph, is specialised to its input
shapes; fed the exact shape of every step it would recompile at almost every step.
So under compilation a pass is padded to a small set of shapes: the batch to one of
:data:`BATCH_BUCKETS` (then multiples of the largest), the tokens per row to a power
of two (a verify pass always to the maximum lookahead + 1), and the KV span read to a
power of two of at least :data:`MIN_SPAN`. Eager decoding (the reference) runs exact
shapes: padding there would only cost time.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbatch.decoding.lookahead import MAX_LOOKAHEAD

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MIN_SPAN = 64


def _power_of_two_at_least(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


@dataclass(frozen=True)
class Shapes:
    """The padding policy of one step runner: ``static`` pads to buckets, otherwise
    every shape is exact."""

    static: bool

    def batch(self, rows: int) -> int:
        if not self.static:
            return rows
        for bucket in BATCH_BUCKETS:
            if rows <= bucket:
                return bucket
        largest = BATCH_BUCKETS[-1]
        return -(-rows // largest) * largest

    def width(self, tokens: int) -> int:
        """Tokens per row of a prefill chunk or a draft's first pass."""
        return _power_of_two_at_least(tokens) if self.static else tokens

    def lookahead(self, k: int) -> int:
        """Draft columns of a verify pass."""
        return MAX_LOOKAHEAD if self.static else k

    def span(self, positions: int) -> int:
        """KV slots a pass reads, covering logical positions 0..positions-1."""
        return max(MIN_SPAN, _power_of_two_at_least(positions)) if self.static else positions
