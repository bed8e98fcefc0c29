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
with them. :class:`KvForecast` runs the same arithmetic forward in time for the queue's
predicted starts: a freed row slot starts its prompt only once the cache has room for it.
"""

from __future__ import annotations

from collections.abc import Callable
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

    def never_holds(self, row: KvRow) -> bool:
        """Whether ``row`` outgrows the cache even alone in it, with no margin."""
        return row.held + row.remaining + self.row_slack_tokens > self.total_tokens

    def holds_at_their_ends(self, rows: tuple[KvRow, ...], margin: float) -> bool:
        """Whether the cache, less ``margin``, holds every row and ``rows`` each at its
        end (its tokens, those to come and its slack) at once: then no step of any order
        of their starts and ends outgrows it (the peak is never above that sum)."""
        every = (*self.rows, *rows)
        ends = sum(row.held + row.remaining + self.row_slack_tokens for row in every)
        return self.other_tokens + ends + margin <= self.total_tokens


@dataclass(frozen=True)
class _TimedRow:
    """A row of a forecast: ``row`` as held at ``from_s``, growing a token every
    ``s_per_token`` seconds from then until its remaining tokens are made, gone at ``end_s``."""

    row: KvRow
    from_s: float
    end_s: float


class KvForecast:
    """An instance's KV cache over time as the queue's predicted starts fill it: its rows
    now and the rows predicted to start, each growing a token every ``s_per_token``
    seconds and leaving at its predicted end. A row slot that frees up only starts a
    prompt where the plan at that moment has room for it (:meth:`KvPlan.fits`), as the
    live b_mem decides; where memory binds, counting slots alone puts starts too early
    and admits prompts that then wait past their SLA for memory."""

    def __init__(self, plan: KvPlan, ends_s: list[float], now_s: float, s_per_token: float) -> None:
        self._total = plan.total_tokens
        self._other = plan.other_tokens
        self._row_slack_tokens = plan.row_slack_tokens
        self._s_per_token = max(s_per_token, 1e-9)
        self._rows = [_TimedRow(row, now_s, end_s) for row, end_s in zip(plan.rows, ends_s, strict=True)]

    def add(self, row: KvRow, grows_from_s: float, end_s: float) -> None:
        self._rows.append(_TimedRow(row, grows_from_s, end_s))

    def first_room_s(self, row: KvRow, at_s: float, margin: Callable[[int], float]) -> float:
        """The earliest moment from ``at_s`` (then each later end of a row) at which ``row``
        started then fits with ``margin(rows then + 1)``, or no row is left: what else the
        cache holds then is not forecast, and an idle instance starts even a prompt that
        outgrows its empty cache (its engine answers that prompt with an error)."""
        ends = sorted({timed.end_s for timed in self._rows if timed.end_s > at_s})
        for moment_s in (at_s, *ends):  # at the last end no row is left
            plan = self._plan_at(moment_s)
            if not plan.rows or plan.fits((row,), margin(len(plan.rows) + 1)):
                break
        return moment_s

    def _plan_at(self, moment_s: float) -> KvPlan:
        rows = []
        for timed in self._rows:
            if timed.end_s <= moment_s:
                continue
            made = min(timed.row.remaining, max(0.0, (moment_s - timed.from_s) / self._s_per_token))
            rows.append(KvRow(timed.row.held + made, timed.row.remaining - made))
        return KvPlan(self._total, self._other, self._row_slack_tokens, rows)
