"""The forward passes of one engine iteration over whichever rows run in it.

Per row the invariant is: the decoding model's store holds the first ``seq_len - 1``
committed tokens (the last one is pending and fed by the next step); the draft may
lag further, and its first pass of a speculative step feeds what it misses (at most
a few tokens; longer lags are caught up by prefill passes first). Every pass writes
its keys/values into the row's blocks before attending, and a query at position p
reads slots 0..p of its own row, so whatever sits beyond p (a rejected draft, a token
of the row that held the block before) is never read. No model is fed a token it
has already cached.

The passes themselves are the pure step functions of
:mod:`specbatch.decoding.step_functions`, run under the runner's compile mode; this
module turns rows (host state) into padded device tensors and the results back into
rows, with one device-to-host copy per decode step (the committed tokens; a step
with rows that report log-probabilities copies those after them).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import torch

from specbatch.decoding import counter_random
from specbatch.decoding.attention import attention_backend
from specbatch.decoding.buckets import Shapes
from specbatch.decoding.compiled import StepFunctions, check_mode
from specbatch.decoding.costs import PassCosts
from specbatch.decoding.kv_blocks import BlockPool, KVStore, slot_table, write_slots
from specbatch.decoding.models import Qwen3Forward
from specbatch.decoding.pair import ModelPair
from specbatch.decoding.pass_clock import PassClock
from specbatch.decoding.rows import Row
from specbatch.decoding.sampling import EndMask, LogitBias, PenaltyTensors, SamplingFeatures, SamplingTensors
from specbatch.decoding.step_functions import Draws, Feed, Network
from specbatch.logprobs import TokenLogprob

# A speculative step's first draft pass feeds at most this many tokens per row (the
# pending token and what the draft missed); a row lagging more is caught up first.
MAX_DRAFT_CATCH_UP = 3

FeedObserver = Callable[[str, list[int], torch.Tensor, torch.Tensor, torch.Tensor], None]


class StepRunner:
    """Runs prefill chunks, plain steps and speculative steps on a pair's block stores.

    ``compile``: ``"none"`` (eager, exact shapes: the reference), ``"default"``
    (torch.compile over padded bucket shapes) or ``"cuda_graphs"`` (the same, each
    shape captured once as a CUDA graph; CUDA only). Compiled modes on CUDA attend
    through FlexAttention, everything else through the grouped attention."""

    def __init__(self, pair: ModelPair, pool: BlockPool, compile: str = "none") -> None:
        check_mode(compile, pair.device)
        self.pair = pair
        self.pool = pool
        self.device = pair.device
        self.compile = compile
        self.shapes = Shapes(static=compile != "none")
        self.functions = StepFunctions(compile, self.device)
        attention = attention_backend(
            "flex" if compile != "none" and self.device.type == "cuda" else "grouped"
        )
        self.models: dict[str, Qwen3Forward] = {"target": pair.target}
        if pair.draft is not None:
            self.models["draft"] = pair.draft
        self.stores: dict[str, KVStore] = {n: m.new_store(pool.num_slots) for n, m in self.models.items()}
        self.networks = {
            name: Network(model.weights, model.geometry, self.stores[name], pair.vocab_size, attention)
            for name, model in self.models.items()
        }
        for network in self.networks.values():
            self.functions.pin(network.tensors())
        # Forward passes per network, the rest of a step (tensors in and out, sampling,
        # verification) per kind of step, fitted on the rows it ran, and the rest of the
        # engine's iteration around the step per kind of step (admitting, choosing K,
        # delivering: observed by the engine), which every step pays once whatever it
        # commits.
        self.costs: dict[str, PassCosts] = {
            name: PassCosts()
            for name in (
                "target",
                "draft",
                "step_speculative",
                "step_plain",
                "iteration_speculative",
                "iteration_plain",
            )
        }
        self.clock = PassClock(self.device)
        self.pass_seconds = 0.0  # time spent in forward passes, for the step overhead
        self.prefilled_tokens = 0  # prompt tokens fed by prefill chunks and catch-up, both models
        # Optional instrumentation: called with (model name, row keys, tokens, positions,
        # real-token mask) before every forward pass.
        self.feed_observer: FeedObserver | None = None

    # ---- host rows to device tensors --------------------------------------------------

    def _tensor(self, data: list, dtype: torch.dtype) -> torch.Tensor:
        """Host data on the device without waiting for it (pinned, asynchronous copy)."""
        tensor = torch.tensor(data, dtype=dtype)
        if self.device.type == "cuda":
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor

    def _feed(
        self,
        rows: Sequence[Row],
        token_rows: list[list[int]],
        position_rows: list[list[int]],
        real_rows: list[list[bool]],
        span: int,
    ) -> tuple[Feed, torch.Tensor]:
        """A feed for ``rows`` (padded to the tensors' batch); the real-token mask too."""
        batch = len(token_rows)
        tables = [r.blocks for r in rows] + [[]] * (batch - len(rows))
        read = slot_table(tables, span, self.pool, self.device)
        positions = self._tensor(position_rows, torch.long)
        real = self._tensor(real_rows, torch.bool)
        feed = Feed(
            self._tensor(token_rows, torch.long),
            positions,
            write_slots(read, positions, real, self.pool),
            read,
        )
        return feed, real

    def _ragged(self, rows: Sequence[Row], spans: Sequence[tuple[int, int]], batch: int, width: int):
        """Right-padded token, position and real-token lists for tokens[start:end] per
        row, padded with empty rows to ``batch``."""
        token_rows, position_rows, real_rows = [], [], []
        for row, (start, end) in zip(rows, spans, strict=True):
            pad = width - (end - start)
            token_rows.append(row.tokens[start:end] + [0] * pad)
            position_rows.append(list(range(start, end)) + [0] * pad)
            real_rows.append([True] * (end - start) + [False] * pad)
        for _ in range(batch - len(rows)):
            token_rows.append([0] * width)
            position_rows.append([0] * width)
            real_rows.append([False] * width)
        return token_rows, position_rows, real_rows

    def _draws(self, rows: Sequence[Row], batch: int) -> tuple[Draws, SamplingFeatures]:
        """Sampling settings and keys per row; padding rows are greedy."""
        pad = batch - len(rows)
        requests = [r.request for r in rows]
        temperature = [q.temperature for q in requests] + [0.0] * pad
        top_p = [q.top_p for q in requests] + [1.0] * pad
        top_k = [q.top_k for q in requests] + [0] * pad
        coupled = [r.coupled for r in rows] + [False] * pad
        min_p = [q.min_p for q in requests] + [0.0] * pad
        params = SamplingTensors(
            self._tensor(temperature, torch.float32),
            self._tensor(top_p, torch.float32),
            self._tensor(top_k, torch.long),
            self._tensor(min_p, torch.float32) if any(min_p) else None,
        )
        seeds = self._tensor([r.seed for r in rows] + [0] * pad, torch.long)
        logprobs = [q.logprobs for q in requests]
        penalties = [q.penalties for q in requests]
        bias = [q.logit_bias for q in requests]
        short = [len(r.output.tokens) < r.output.min_tokens for r in rows]
        features = SamplingFeatures.of(
            temperature, top_p, top_k, coupled, self.pair.vocab_size, logprobs, penalties, min_p, bias, short
        )
        penalty_tensors = self._penalties(rows, batch, features) if features.penalties else None
        bias_tensors = self._logit_bias(bias, batch) if features.logit_bias else None
        end_mask = self._end_mask(rows, short, batch) if features.end_mask else None
        coupled_rows = self._tensor(coupled, torch.bool)
        draws = Draws(params, seeds, coupled_rows, penalty_tensors, bias_tensors, end_mask)
        return draws, features

    def _end_mask(self, rows: Sequence[Row], short: Sequence[bool], batch: int) -> EndMask:
        """The tokens that would end each row short of its min_tokens (none for the others
        and for padding rows), padded with the id past the vocabulary, and where its
        min_tokens end."""
        ends = [
            sorted(r.output.stop_token_ids | (set() if r.output.ignore_eos else self.pair.eos_token_ids))
            if is_short
            else []
            for r, is_short in zip(rows, short, strict=True)
        ]
        until = [r.prompt_length + r.output.min_tokens for r in rows] + [0] * (batch - len(rows))
        return EndMask(self._padded_ids(ends, batch), self._tensor(until, torch.long))

    def _logit_bias(self, bias: list[Sequence[tuple[int, float]]], batch: int) -> LogitBias:
        """Each row's (token, bias) pairs, padded with the id past the vocabulary."""
        return LogitBias(
            ids=self._padded_ids([[token for token, _ in pairs] for pairs in bias], batch),
            values=self._padded([[value for _, value in pairs] for pairs in bias], batch, 0.0, torch.float32),
        )

    def _padded_ids(self, rows_ids: list[list[int]], batch: int) -> torch.Tensor:
        """Token ids per row [batch, width], padded with the id past the vocabulary, which
        stands for no token."""
        return self._padded(rows_ids, batch, self.pair.vocab_size, torch.long)

    def _padded(self, rows_values: list[list], batch: int, fill: float, dtype: torch.dtype) -> torch.Tensor:
        """Rows of values as one [batch, width] tensor: each row and the padding rows
        after them filled with ``fill`` to a width of the shapes' buckets."""
        width = self.shapes.width(max([1, *map(len, rows_values)]))
        filled = [list(values) + [fill] * (width - len(values)) for values in rows_values]
        return self._tensor(filled + [[fill] * width] * (batch - len(rows_values)), dtype)

    def _penalties(self, rows: Sequence[Row], batch: int, features: SamplingFeatures) -> PenaltyTensors:
        """What the rows' penalties read: their outputs so far and, where a repetition
        penalty needs them, their prompts; padding rows and padded ids count for nothing."""
        pad = batch - len(rows)
        presence, frequency, repetition = zip(*[r.request.penalties for r in rows], strict=True)
        outputs = [r.tokens[r.prompt_length :] for r in rows]
        prompts = [r.tokens[: r.prompt_length] if features.repetition else [] for r in rows]
        return PenaltyTensors(
            presence=self._tensor([*presence] + [0.0] * pad, torch.float32),
            frequency=self._tensor([*frequency] + [0.0] * pad, torch.float32),
            repetition=self._tensor([*repetition] + [1.0] * pad, torch.float32),
            output_ids=self._padded_ids(outputs, batch),
            prompt_ids=self._padded_ids(prompts, batch),
            step_tokens=self._tensor([[]] * batch, torch.long).reshape(batch, 0),
        )

    # ---- forward passes ---------------------------------------------------------------

    def _run(
        self,
        name: str,
        rows: Sequence[Row],
        feed: Feed,
        real: torch.Tensor,
        num_real: int,
        span: int,
        function: Callable,
        *args: object,
    ):
        """One observed, timed pass over ``rows`` (the first ``len(rows)`` of the feed)."""
        count = len(rows)
        if self.feed_observer is not None:
            self.feed_observer(
                name, [r.key for r in rows], feed.tokens[:count], feed.positions[:count], real[:count]
            )
        self.models[name].tokens_fed += num_real
        fed = count * feed.tokens.shape[1]
        started = self.clock.start()
        out = function(self.networks[name], feed, *args)

        def record(seconds: float) -> None:
            self.pass_seconds += seconds
            self.costs[name].observe(fed, count * span, fed * span, seconds)

        self.clock.stop(started, record)
        return out

    def prefill(
        self,
        rows: Sequence[Row],
        name: str,
        budget: int,
        writable_end: Callable[[Row, int, int], int] | None = None,
    ) -> int:
        """Cache up to ``budget`` more tokens of the rows' committed prefixes (all but the
        pending token) in the ``name`` model, first rows first; returns tokens fed.
        ``writable_end(row, start, end)`` may stop a row short of ``end`` (a block
        another row is writing)."""
        chosen, spans = [], []
        for row in rows:
            cached = row.cached(name)
            end = min(row.seq_len - 1, cached + budget)
            if writable_end is not None and end > cached:
                end = writable_end(row, cached, end)
            if end > cached:
                chosen.append(row)
                spans.append((cached, end))
                budget -= end - cached
            if budget <= 0:
                break
        if not chosen:
            return 0
        width = self.shapes.width(max(end - start for start, end in spans))
        lists = self._ragged(chosen, spans, self.shapes.batch(len(chosen)), width)
        furthest = max(end for _, end in spans)
        feed, real = self._feed(chosen, *lists, self.shapes.span(furthest))
        fed = sum(end - start for start, end in spans)
        self._run(name, chosen, feed, real, fed, furthest, self.functions.prefill_chunk)
        self.prefilled_tokens += fed
        for row, (_, end) in zip(chosen, spans, strict=True):
            row.set_cached(name, end)
        return fed

    def calibrate(self, repeats: int = 3) -> None:
        """Time passes of each model over a spread of batch sizes, tokens per row and
        context, on the scratch block only (no row's memory is touched), so the cost
        model can tell a verify pass from a plain one before the first real step. The
        shapes are the ones steps run (a draft's catch-up pass, a verify pass), so under
        compilation calibrating also builds the graphs the first steps need."""
        limit = min(self.pair.max_context, self.pool.num_blocks * self.pool.block_size)
        widths = {"target": (1, self.shapes.lookahead(8) + 1), "draft": (1, MAX_DRAFT_CATCH_UP + 1)}
        for name in self.networks:
            for batch, steps, span in [(b, t, s) for b in (1, 8) for t in widths[name] for s in (16, 512)]:
                span = max(steps, min(span, limit))
                function, args = self._calibration_pass(name, batch, steps, span)
                for attempt in range(repeats + 1):
                    started = self.clock.start()
                    function(self.networks[name], *args)
                    if attempt:  # the first run warms up (and compiles)
                        self.clock.stop(started, self._costs_recorder(name, batch, steps, span))
        self.clock.settle()

    def _calibration_pass(self, name: str, batch: int, steps: int, span: int) -> tuple[Callable, tuple]:
        """A step function and its arguments for ``batch`` blank rows feeding ``steps``
        tokens at the end of ``span`` positions, every write to scratch."""
        padded = self.shapes.batch(batch)
        draws, features = self._draws([], padded)
        positions = torch.arange(span - steps, span, device=self.device).expand(padded, steps)
        read = slot_table([[]] * padded, self.shapes.span(span), self.pool, self.device)
        real = torch.zeros_like(positions, dtype=torch.bool)
        # blank tokens that do not touch torch's global generator: it runs on the loop
        # thread while callers may be drawing row keys from that generator
        tokens = torch.arange(padded * steps, device=self.device).view(padded, steps) % self.pair.vocab_size
        feed = Feed(tokens, positions, write_slots(read, positions, real, self.pool), read)
        seq_len = positions[:, 0] + 1
        if steps > 1 and name == "target":
            drafts, lookahead = tokens[:, 1:], torch.full_like(seq_len, steps - 1)
            draft_probs = torch.zeros(padded, steps - 1, self.pair.vocab_size, device=self.device)
            return self.functions.verify_step, (
                feed,
                draws,
                seq_len,
                drafts,
                draft_probs,
                lookahead,
                features,
            )
        index = torch.full((padded, 1), steps - 1, dtype=torch.long, device=self.device)
        return self.functions.sample_step, (feed, index, draws, seq_len, counter_random.NEXT, features)

    def _costs_recorder(self, name: str, batch: int, steps: int, span: int) -> Callable[[float], None]:
        def record(seconds: float) -> None:
            self.costs[name].observe(batch * steps, batch * span, batch * steps * span, seconds)

        return record

    # ---- decode steps -----------------------------------------------------------------

    def _observe_overhead(self, kind: str, rows: int, started: float, passes_before: float) -> None:
        self.clock.settle()
        overhead = time.perf_counter() - started - (self.pass_seconds - passes_before)
        self.costs[kind].observe(rows, 0, 0, max(0.0, overhead))

    def plain_step(self, rows: Sequence[Row], name: str) -> list[list[int]]:
        """One token per row from the ``name`` model alone (target-only or draft-only)."""
        started, passes_before = time.perf_counter(), self.pass_seconds
        committed = self._plain_step(rows, name)
        self._observe_overhead("step_plain", len(rows), started, passes_before)
        return committed

    def speculative_step(self, rows: Sequence[Row], lookahead: int) -> tuple[list[list[int]], list[int]]:
        """Draft ``lookahead`` tokens per row, verify them in one target pass; returns the
        committed tokens per row and the accepted draft count per row."""
        started, passes_before = time.perf_counter(), self.pass_seconds
        outcome = self._speculative_step(rows, lookahead)
        self._observe_overhead("step_speculative", len(rows), started, passes_before)
        return outcome

    def _plain_step(self, rows: Sequence[Row], name: str) -> list[list[int]]:
        count, batch = len(rows), self.shapes.batch(len(rows))
        spans = [(r.seq_len - 1, r.seq_len) for r in rows]
        furthest = max(r.seq_len for r in rows)
        feed, real = self._feed(rows, *self._ragged(rows, spans, batch, 1), self.shapes.span(furthest))
        draws, features = self._draws(rows, batch)
        draw_at = feed.positions[:, 0] + 1
        index = torch.zeros_like(feed.positions)
        token, _, *logprobs = self._run(
            name,
            rows,
            feed,
            real,
            count,
            furthest,
            self.functions.sample_step,
            index,
            draws,
            draw_at,
            counter_random.NEXT,
            features,
        )
        for row in rows:
            if name == "draft":
                row.draft_cached = row.seq_len
            else:
                row.target_cached = row.seq_len
        committed = [[t] for t in token[:count].tolist()]
        if logprobs:
            _hand_logprobs(rows, committed, *(t.unsqueeze(1) for t in logprobs))
        return committed

    def _speculative_step(self, rows: Sequence[Row], lookahead: int) -> tuple[list[list[int]], list[int]]:
        k = lookahead
        count, batch = len(rows), self.shapes.batch(len(rows))
        draws, features = self._draws(rows, batch)
        draft_features = dataclasses.replace(features, logprobs=None)  # the target's are reported
        longest = max(r.seq_len for r in rows)
        span = self.shapes.span(longest + k)  # the verify pass reads up to seq_len - 1 + k
        seq_len = self._tensor([r.seq_len for r in rows] + [1] * (batch - count), torch.long)
        row_real = (torch.arange(batch, device=self.device) < count).unsqueeze(1)

        # Draft: feed what it misses up to the pending token, then propose k tokens.
        spans = [(r.draft_cached, r.seq_len) for r in rows]
        width = self.shapes.width(max(end - start for start, end in spans))
        feed, real = self._feed(rows, *self._ragged(rows, spans, batch, width), span)
        index = self._tensor(
            [[end - start - 1] for start, end in spans] + [[0]] * (batch - count), torch.long
        )
        fed = sum(end - start for start, end in spans)
        draft_draws = draws
        proposal, draft_probs = [], []
        for i in range(k):
            if i > 0:
                if draws.penalties is not None:  # the proposals so far count as output
                    earlier = dataclasses.replace(draws.penalties, step_tokens=torch.stack(proposal, dim=1))
                    draft_draws = dataclasses.replace(draws, penalties=earlier)
                positions = (seq_len - 1 + i).unsqueeze(1)
                real = row_real
                feed = Feed(
                    proposal[-1].unsqueeze(1),
                    positions,
                    write_slots(feed.read_slots, positions, real, self.pool),
                    feed.read_slots,
                )
                index = torch.zeros_like(positions)
                fed = count
            token, q = self._run(
                "draft",
                rows,
                feed,
                real,
                fed,
                longest + i,
                self.functions.sample_step,
                index,
                draft_draws,
                seq_len + i,
                counter_random.DRAFT,
                draft_features,
            )
            proposal.append(token)
            draft_probs.append(q)

        # Target: the pending token and all k proposals (padded to the verify width) in one pass.
        columns = self.shapes.lookahead(k)
        drafts = torch.stack(proposal, dim=1)
        probs = torch.stack(draft_probs, dim=1)
        if columns > k:
            drafts = torch.cat([drafts, drafts.new_zeros(batch, columns - k)], dim=1)
            probs = torch.cat([probs, probs.new_zeros(batch, columns - k, probs.shape[-1])], dim=1)
        pending = self._tensor([[r.tokens[-1]] for r in rows] + [[0]] * (batch - count), torch.long)
        offsets = torch.arange(columns + 1, device=self.device)
        positions = (seq_len - 1).unsqueeze(1) + offsets
        real = row_real & (offsets <= k)
        verify_feed = Feed(
            torch.cat([pending, drafts], dim=1),
            positions,
            write_slots(feed.read_slots, positions, real, self.pool),
            feed.read_slots,
        )
        real_lookahead = torch.full((batch,), k, dtype=torch.long, device=self.device)
        accepted, next_token, *logprobs = self._run(
            "target",
            rows,
            verify_feed,
            real,
            count * (k + 1),
            longest + k,
            self.functions.verify_step,
            draws,
            seq_len,
            drafts,
            probs,
            real_lookahead,
            features,
        )
        # The step's one synchronisation: accepted counts, next tokens and drafts to the host.
        outcome = torch.cat([accepted.unsqueeze(1), next_token.unsqueeze(1), drafts[:, :k]], dim=1)[
            :count
        ].tolist()
        committed, counts = [], []
        for row, (n, last, *drafted) in zip(rows, outcome, strict=True):
            old = row.seq_len
            committed.append([*drafted[:n], last])
            counts.append(n)
            new = old + n + 1
            row.target_cached = new - 1
            row.draft_cached = min(old + k - 1, new - 1)
            row.drafted += k
            row.accepted += n
            row.rejections += int(n < k)
        if logprobs:
            _hand_logprobs(rows, committed, *logprobs)
        return committed, counts


def _hand_logprobs(
    rows: Sequence[Row],
    committed: list[list[int]],
    chosen: torch.Tensor,
    top_values: torch.Tensor,
    top_ids: torch.Tensor,
) -> None:
    """Give each row that reports log-probabilities those of the tokens it committed
    this step (column j of the tensors [B, M(, A)] is its j-th token), with as many
    alternatives as it asked for."""
    wanted = [i for i, row in enumerate(rows) if row.request.logprobs is not None]
    if not wanted:
        return
    picked = torch.tensor(wanted, device=chosen.device)
    chosen_rows = chosen[picked].tolist()
    value_rows, id_rows = top_values[picked].tolist(), top_ids[picked].tolist()
    for i, logprobs, values, ids in zip(wanted, chosen_rows, value_rows, id_rows, strict=True):
        row, alternatives = rows[i], rows[i].request.logprobs
        row.new_logprobs = [
            TokenLogprob(
                token, logprobs[j], tuple(zip(ids[j][:alternatives], values[j][:alternatives], strict=True))
            )
            for j, token in enumerate(committed[i])
        ]
