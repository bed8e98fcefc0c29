"""The forward passes of one engine iteration over whichever rows run in it.

Per row the invariant is: the decoding model's store holds the first ``seq_len - 1``
committed tokens (the last one is pending and fed by the next step); the draft may
lag further, and its first pass of a speculative step feeds what it misses (at most
a few tokens; longer lags are caught up by prefill passes first). Every pass writes
its keys/values into the row's blocks before attending, and a query at position p
reads slots 0..p of its own row, so whatever sits beyond p (a rejected draft, a token
of the row that held the block before) is never read. No model is fed a token it
has already cached.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from specbatch.decoding import counter_random
from specbatch.decoding.costs import PassCosts
from specbatch.decoding.kv_blocks import BlockPool, KVStore, layout_for
from specbatch.decoding.models import Qwen3Forward
from specbatch.decoding.pair import ModelPair
from specbatch.decoding.rows import Row
from specbatch.decoding.sampling import SamplingParams, gumbel_argmax, probabilities, sample
from specbatch.decoding.speculative import Verdict, verify, verify_coupled

# A speculative step's first draft pass feeds at most this many tokens per row (the
# pending token and what the draft missed); a row lagging more is caught up first.
MAX_DRAFT_CATCH_UP = 3

FeedObserver = Callable[[str, list[int], torch.Tensor, torch.Tensor, torch.Tensor], None]


class StepRunner:
    """Runs prefill chunks, plain steps and speculative steps on a pair's block stores."""

    def __init__(self, pair: ModelPair, pool: BlockPool) -> None:
        self.pair = pair
        self.pool = pool
        self.device = pair.device
        self.models: dict[str, Qwen3Forward] = {"target": pair.target}
        if pair.draft is not None:
            self.models["draft"] = pair.draft
        self.stores: dict[str, KVStore] = {n: m.new_store(pool.num_slots) for n, m in self.models.items()}
        # Forward passes per network, and the rest of a step (tensors in and out, sampling,
        # verification) per kind of step, fitted on the rows it ran.
        self.costs: dict[str, PassCosts] = {
            name: PassCosts() for name in ("target", "draft", "step_speculative", "step_plain")
        }
        self.pass_seconds = 0.0  # time spent in forward passes, for the step overhead
        # Optional instrumentation: called with (model name, row keys, tokens, positions,
        # real-token mask) before every forward pass.
        self.feed_observer: FeedObserver | None = None

    # ---- forward passes ---------------------------------------------------------------

    def _forward(
        self,
        name: str,
        rows: Sequence[Row],
        tokens: torch.Tensor,
        positions: torch.Tensor,
        real: torch.Tensor,
        logits_at: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """One observed, timed pass; logits [B, M, V] cut to the shared id range, or
        None for a fill."""
        if self.feed_observer is not None:
            self.feed_observer(name, [r.key for r in rows], tokens, positions, real)
        started = time.perf_counter()
        span = int(positions.max()) + 1
        logits = self._pass(name, [r.blocks for r in rows], tokens, positions, real, logits_at, span)
        seconds = time.perf_counter() - started
        self.pass_seconds += seconds
        self.costs[name].observe(tokens.numel(), len(rows) * span, tokens.numel() * span, seconds)
        return logits

    def _pass(
        self,
        name: str,
        tables: Sequence[Sequence[int]],
        tokens: torch.Tensor,
        positions: torch.Tensor,
        real: torch.Tensor,
        logits_at: torch.Tensor | None,
        span: int,
    ) -> torch.Tensor | None:
        """One forward pass reading logical positions 0..span-1 of each row."""
        model, store = self.models[name], self.stores[name]
        layout = layout_for(tables, positions, real, self.pool, span)
        num_real = int(real.sum())
        if logits_at is None:
            model.fill(tokens, positions, store, layout, num_real=num_real)
            return None
        logits = model(tokens, positions, store, layout, logits_at, num_real=num_real)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return logits[..., : self.pair.vocab_size]

    def _ragged(self, rows: Sequence[Row], spans: Sequence[tuple[int, int]]):
        """Right-padded tokens [B, T], positions and real mask for tokens[start:end] per row."""
        width = max(1, max(end - start for start, end in spans))
        token_rows, position_rows, real_rows = [], [], []
        for row, (start, end) in zip(rows, spans, strict=True):
            count = end - start
            token_rows.append(row.tokens[start:end] + [0] * (width - count))
            position_rows.append(list(range(start, end)) + [0] * (width - count))
            real_rows.append([True] * count + [False] * (width - count))
        return (
            torch.tensor(token_rows, dtype=torch.long, device=self.device),
            torch.tensor(position_rows, dtype=torch.long, device=self.device),
            torch.tensor(real_rows, dtype=torch.bool, device=self.device),
        )

    def prefill(self, rows: Sequence[Row], name: str, budget: int) -> int:
        """Cache up to ``budget`` more tokens of the rows' committed prefixes (all but the
        pending token) in the ``name`` model, first rows first; returns tokens fed."""
        chosen, spans = [], []
        for row in rows:
            cached = row.draft_cached if name == "draft" else row.target_cached
            end = min(row.seq_len - 1, cached + budget)
            if end > cached:
                chosen.append(row)
                spans.append((cached, end))
                budget -= end - cached
            if budget <= 0:
                break
        if not chosen:
            return 0
        tokens, positions, real = self._ragged(chosen, spans)
        self._forward(name, chosen, tokens, positions, real, None)
        for row, (_, end) in zip(chosen, spans, strict=True):
            if name == "draft":
                row.draft_cached = end
            else:
                row.target_cached = end
        return sum(end - start for start, end in spans)

    def calibrate(self, repeats: int = 3) -> None:
        """Time passes of each model over a spread of batch sizes, tokens per row and
        context, on the scratch block only (no row's memory is touched), so the cost
        model can tell a verify pass from a plain one before the first real step."""
        limit = min(self.pair.max_context, self.pool.num_blocks * self.pool.block_size)
        shapes = [(b, t, s) for b in (1, 8) for t in (1, 9) for s in (16, 512)]
        for name in self.models:
            for batch, steps, span in shapes:
                span = max(steps, min(span, limit))
                positions = torch.arange(span - steps, span, device=self.device).expand(batch, steps)
                tokens = torch.randint(0, self.pair.vocab_size, (batch, steps), device=self.device)
                real = torch.zeros_like(tokens, dtype=torch.bool)  # every write goes to scratch
                logits_at = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
                for attempt in range(repeats + 1):
                    started = time.perf_counter()
                    self._pass(name, [[]] * batch, tokens, positions, real, logits_at, span)
                    seconds = time.perf_counter() - started
                    if attempt:  # the first run warms up
                        self.costs[name].observe(tokens.numel(), batch * span, tokens.numel() * span, seconds)

    # ---- drawing tokens ---------------------------------------------------------------

    def _params(self, rows: Sequence[Row]) -> SamplingParams:
        return SamplingParams.from_lists(
            [r.request.temperature for r in rows],
            [r.request.top_p for r in rows],
            [r.request.top_k for r in rows],
            self.device,
        )

    def _keys(self, rows: Sequence[Row]) -> tuple[torch.Tensor, torch.Tensor]:
        seeds = torch.tensor([r.seed for r in rows], dtype=torch.long, device=self.device)
        coupled = torch.tensor([r.coupled for r in rows], dtype=torch.bool, device=self.device)
        return seeds, coupled

    def _gumbel_choice(
        self, probs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, coupled: torch.Tensor
    ) -> torch.Tensor:
        """[B, M] Gumbel-max draws for coupled rows (zeros elsewhere)."""
        choice = torch.zeros(positions.shape, dtype=torch.long, device=self.device)
        index = coupled.nonzero().squeeze(1)
        if index.numel():
            noise = counter_random.gumbel_noise(seeds[index], positions[index], probs.shape[-1])
            choice[index] = gumbel_argmax(probs[index], noise)
        return choice

    def _draw(
        self,
        probs: torch.Tensor,
        seeds: torch.Tensor,
        coupled: torch.Tensor,
        position: torch.Tensor,
        purpose: int,
    ) -> torch.Tensor:
        """One token per row from ``probs`` [B, V] for the token at ``position`` [B]."""
        uniform = counter_random.uniforms(seeds, position.unsqueeze(1), purpose)[:, 0]
        drawn = sample(probs, uniform)
        if bool(coupled.any()):
            gumbel = self._gumbel_choice(probs.unsqueeze(1), seeds, position.unsqueeze(1), coupled)[:, 0]
            drawn = torch.where(coupled, gumbel, drawn)
        return drawn

    # ---- decode steps -----------------------------------------------------------------

    def _observe_overhead(self, kind: str, rows: int, started: float, passes_before: float) -> None:
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
        seq_len = torch.tensor([r.seq_len for r in rows], dtype=torch.long, device=self.device)
        pending = torch.tensor([[r.tokens[-1]] for r in rows], dtype=torch.long, device=self.device)
        positions = (seq_len - 1).unsqueeze(1)
        real = torch.ones_like(pending, dtype=torch.bool)
        logits = self._forward(name, rows, pending, positions, real, torch.zeros_like(positions))
        seeds, coupled = self._keys(rows)
        probs = probabilities(logits, self._params(rows))[:, 0]
        token = self._draw(probs, seeds, coupled, seq_len, counter_random.NEXT)
        for row in rows:
            if name == "draft":
                row.draft_cached = row.seq_len
            else:
                row.target_cached = row.seq_len
        return [[t] for t in token.tolist()]

    def _speculative_step(self, rows: Sequence[Row], lookahead: int) -> tuple[list[list[int]], list[int]]:
        k = lookahead
        device = self.device
        params = self._params(rows)
        seeds, coupled = self._keys(rows)
        seq_len = torch.tensor([r.seq_len for r in rows], dtype=torch.long, device=device)

        # Draft: feed what it misses up to the pending token, then propose k tokens.
        tokens, positions, real = self._ragged(rows, [(r.draft_cached, r.seq_len) for r in rows])
        logits_at = (real.sum(1) - 1).unsqueeze(1)
        proposal, draft_probs = [], []
        for i in range(k):
            if i > 0:
                tokens = proposal[-1].unsqueeze(1)
                positions = (seq_len - 1 + i).unsqueeze(1)
                real = torch.ones_like(tokens, dtype=torch.bool)
                logits_at = torch.zeros_like(positions)
            q = probabilities(self._forward("draft", rows, tokens, positions, real, logits_at), params)[:, 0]
            draft_probs.append(q)
            proposal.append(self._draw(q, seeds, coupled, seq_len + i, counter_random.DRAFT))
        drafts = torch.stack(proposal, dim=1)

        # Target: the pending token and all k proposals in one pass.
        pending = torch.tensor([[r.tokens[-1]] for r in rows], dtype=torch.long, device=device)
        verify_tokens = torch.cat([pending, drafts], dim=1)
        offsets = torch.arange(k + 1, device=device)
        verify_positions = (seq_len - 1).unsqueeze(1) + offsets
        target_logits = self._forward(
            "target",
            rows,
            verify_tokens,
            verify_positions,
            torch.ones_like(verify_tokens, dtype=torch.bool),
            offsets.expand(len(rows), k + 1),
        )
        target_probs = probabilities(target_logits, params)
        token_positions = seq_len.unsqueeze(1) + offsets  # where each possible new token lands
        verdict = verify(
            drafts,
            torch.stack(draft_probs, dim=1),
            target_probs,
            counter_random.uniforms(seeds, token_positions[:, :k], counter_random.ACCEPT),
            counter_random.uniforms(seeds, token_positions, counter_random.NEXT),
        )
        if bool(coupled.any()):
            choice = self._gumbel_choice(target_probs, seeds, token_positions, coupled)
            gumbel = verify_coupled(drafts, choice)
            verdict = Verdict(
                accepted=torch.where(coupled, gumbel.accepted, verdict.accepted),
                next_token=torch.where(coupled, gumbel.next_token, verdict.next_token),
            )
        counts = verdict.accepted.tolist()
        drafted_rows = drafts.tolist()
        next_tokens = verdict.next_token.tolist()
        committed = []
        for row, n, drafted, last in zip(rows, counts, drafted_rows, next_tokens, strict=True):
            old = row.seq_len
            committed.append([*drafted[:n], last])
            new = old + n + 1
            row.target_cached = new - 1
            row.draft_cached = min(old + k - 1, new - 1)
            row.drafted += k
            row.accepted += n
            row.rejections += int(n < k)
        return committed, counts
