"""Batched generation: speculative (draft K, verify K in one target pass) and plain.

Both modes run over the same machinery (prefill, position-indexed caches, sampler,
stop rules), so comparing them is fair.

Per row the engine keeps ``seq_len`` (committed tokens: prompt + output) and the
invariant that the target's cache holds the first ``seq_len - 1`` of them: the last
committed token is pending and is fed by the next step. The draft's cache may lag one
more token (``draft_lag``) after a step that accepted every draft token, because the
last draft token was proposed but never fed; the next step's first draft pass feeds
that token together with the pending one. No model is ever fed a token it has cached.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specbatch.decoding.cache import KVCache
from specbatch.decoding.lookahead import MAX_LOOKAHEAD, Lookahead
from specbatch.decoding.models import Qwen3Forward
from specbatch.decoding.pair import ModelPair
from specbatch.decoding.requests import (
    GenerationRequest,
    GenerationResult,
    InvalidRequestError,
    check_sampling_settings,
)
from specbatch.decoding.sampling import RowRandom, SamplingParams, probabilities, sample
from specbatch.decoding.scoring import ChoiceScores, score_choices
from specbatch.decoding.speculative import verify
from specbatch.decoding.stopping import RowOutput, StopRules

logger = logging.getLogger(__name__)

MODES = ("speculative", "target_only", "draft_only")

StepObserver = Callable[[dict[int, list[int]]], None]
FinishObserver = Callable[[int, GenerationResult], None]
FeedObserver = Callable[[str, list[int], torch.Tensor, torch.Tensor, torch.Tensor], None]


@dataclass
class _Batch:
    """The rows still decoding, in cache order."""

    request_index: list[int]
    seq_len: torch.Tensor  # [B] committed tokens per row
    last_two: torch.Tensor  # [B, 2] the last two committed tokens
    draft_lag: torch.Tensor  # [B] bool: draft cache misses the token before the pending one
    params: SamplingParams
    rng: RowRandom
    caches: dict[str, KVCache]  # by model name: "target" and "draft", whichever the mode runs

    @property
    def cache_length(self) -> int:
        return next(iter(self.caches.values())).length

    def keep(self, rows: list[int]) -> None:
        index = torch.tensor(rows, dtype=torch.long, device=self.seq_len.device)
        self.request_index = [self.request_index[i] for i in rows]
        self.seq_len = self.seq_len[index]
        self.last_two = self.last_two[index]
        self.draft_lag = self.draft_lag[index]
        self.params = self.params.keep_rows(index)
        self.rng.keep_rows(rows)
        for cache in self.caches.values():
            cache.keep_rows(index)


class Engine:
    """Generation and choice scoring over one :class:`ModelPair`.

    ``lookahead``: None adapts K to the measured acceptance (rolling window); an int
    fixes K. One call runs at a time (a lock serialises concurrent callers).
    """

    def __init__(self, pair: ModelPair, lookahead: int | None = None) -> None:
        self.pair = pair
        self.lookahead = Lookahead(fixed=lookahead)
        # Decode seconds of the last generate() per token of its longest row: the per-token
        # latency a request of that batch saw (the scheduler's SLA feedback).
        self.last_step_seconds_per_token = 0.0
        # Optional instrumentation: called with (model name, request indices, tokens,
        # positions, real-token mask) before every forward pass.
        self.feed_observer: FeedObserver | None = None
        self._kv_tokens_held = 0
        self._lock = threading.Lock()
        self._stop_rules = StopRules(
            pair.eos_token_ids, lambda ids: pair.tokenizer.decode(ids, skip_special_tokens=True)
        )

    # ---- capacity -------------------------------------------------------------------

    @property
    def kv_tokens_held(self) -> int:
        """Token slots allocated per model in the KV caches right now: rows still decoding
        times the preallocated length (0 between calls)."""
        return self._kv_tokens_held

    def free_kv_tokens(self, memory_budget_bytes: int) -> int:
        """How many more tokens (per row of target + draft cache) fit in the budget."""
        capacity = memory_budget_bytes // self.pair.kv_bytes_per_token
        return max(0, capacity - self._kv_tokens_held)

    # ---- validation -----------------------------------------------------------------

    def validate(self, request: GenerationRequest) -> None:
        """Raise InvalidRequestError (a ValueError) with a readable message if the request cannot run."""
        self._prompt_ids(request)

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        check_sampling_settings(request)
        prompt = request.prompt
        if isinstance(prompt, str):
            ids = self.pair.tokenizer.encode(prompt, add_special_tokens=False)
        else:
            try:
                ids = [int(t) for t in prompt]
            except (TypeError, ValueError):
                raise InvalidRequestError("prompt must be a string or a sequence of token ids") from None
            bad = [t for t in ids if not 0 <= t < self.pair.vocab_size]
            if bad:
                raise InvalidRequestError(
                    f"prompt token ids out of range [0, {self.pair.vocab_size}): {bad[:5]}"
                )
        if not ids:
            raise InvalidRequestError("the prompt is empty")
        total = len(ids) + request.max_new_tokens
        if total > self.pair.max_context:
            raise InvalidRequestError(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({request.max_new_tokens}) = {total} "
                f"exceeds the model context of {self.pair.max_context} tokens"
            )
        return ids

    # ---- generation -----------------------------------------------------------------

    def generate(
        self,
        requests: Sequence[GenerationRequest],
        mode: str = "speculative",
        on_step: StepObserver | None = None,
        is_cancelled: Callable[[int], bool] | None = None,
        on_finished: FinishObserver | None = None,
    ) -> list[GenerationResult]:
        """Decode every request as one batch; results come back in request order.

        ``on_step({i: ids, ...})`` is called once per step with every row's newly kept
        tokens (rows that kept none are absent), so a streaming server sends one
        message per step; ``is_cancelled(i)`` is asked between steps and drops the row
        ("cancelled"); ``on_finished(i, result)`` hands over each row's result the step
        it finishes, so a server can answer it without waiting for the longest row.
        """
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; use one of {MODES}")
        draft = self.pair.draft
        if mode != "target_only" and draft is None:
            raise ValueError(f"{mode} mode needs a draft model; this pair has none")
        if not requests:
            return []
        prompts = [self._prompt_ids(r) for r in requests]
        models: dict[str, Qwen3Forward] = {}
        if mode != "draft_only":
            models["target"] = self.pair.target
        if mode != "target_only" and draft is not None:
            models["draft"] = draft
        with self._lock, torch.inference_mode():
            return self._generate(list(requests), prompts, models, on_step, is_cancelled, on_finished)

    def _generate(
        self,
        requests: list[GenerationRequest],
        prompts: list[list[int]],
        models: dict[str, Qwen3Forward],
        on_step: StepObserver | None,
        is_cancelled: Callable[[int], bool] | None,
        on_finished: FinishObserver | None,
    ) -> list[GenerationResult]:
        """``models``: target and draft for speculative decoding, one of them for plain."""
        device = self.pair.device
        speculative = len(models) == 2
        plain_name, plain_model = next(iter(models.items()))  # the one model plain decoding runs
        outputs = [RowOutput(r.max_new_tokens, tuple(r.stop)) for r in requests]
        drafted = [0] * len(requests)
        accepted = [0] * len(requests)
        cache_length = (
            max(len(p) + r.max_new_tokens for p, r in zip(prompts, requests, strict=True)) + MAX_LOOKAHEAD + 1
        )
        batch = _Batch(
            request_index=list(range(len(requests))),
            seq_len=torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device),
            last_two=torch.tensor(
                [([p[-2]] if len(p) > 1 else [0]) + [p[-1]] for p in prompts], device=device
            ),
            draft_lag=torch.zeros(len(requests), dtype=torch.bool, device=device),
            params=SamplingParams.from_lists(
                [r.temperature for r in requests],
                [r.top_p for r in requests],
                [r.top_k for r in requests],
                device,
            ),
            rng=RowRandom([r.seed for r in requests], [r.temperature == 0 for r in requests], device),
            caches={name: model.new_cache(len(requests), cache_length) for name, model in models.items()},
        )
        self._kv_tokens_held = len(requests) * cache_length

        def result(i: int) -> GenerationResult:
            out = outputs[i]
            return GenerationResult(
                tokens=list(out.tokens),
                text=out.text or "",
                finish_reason=out.finish_reason or "length",
                num_input_tokens=len(prompts[i]),
                num_output_tokens=len(out.tokens),
                total_draft_tokens=drafted[i],
                total_accepted_draft_tokens=accepted[i],
            )

        def finished(i: int) -> None:
            if on_finished is not None:
                on_finished(i, result(i))

        try:
            if speculative:
                for cached_name, cached_model in models.items():
                    self._prefill(batch, prompts, cached_name, cached_model)
            else:
                first = self._prefill_and_sample(batch, prompts, plain_name, plain_model)
                self._commit(batch, outputs, first, on_step, finished)
            decode_start = time.perf_counter()
            produced_at_decode_start = max(len(o.tokens) for o in outputs)
            while batch.request_index:
                self._drop_cancelled(batch, outputs, is_cancelled, finished)
                if not batch.request_index:
                    break
                if speculative:
                    new_tokens = self._speculative_step(batch, models, outputs, drafted, accepted)
                else:
                    new_tokens = self._plain_step(batch, plain_name, plain_model)
                self._commit(batch, outputs, new_tokens, on_step, finished)
            decode_seconds = time.perf_counter() - decode_start
            decoded = max(len(o.tokens) for o in outputs) - produced_at_decode_start
            self.last_step_seconds_per_token = decode_seconds / max(1, decoded)
        finally:
            self._kv_tokens_held = 0
        return [result(i) for i in range(len(requests))]

    def _observe(
        self, name: str, batch: _Batch, tokens: torch.Tensor, positions: torch.Tensor, real: torch.Tensor
    ):
        if self.feed_observer is not None:
            self.feed_observer(name, list(batch.request_index), tokens, positions, real)

    def _feed(
        self,
        name: str,
        model: Qwen3Forward,
        batch: _Batch,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        real: torch.Tensor,
        logits_at: torch.Tensor,
    ) -> torch.Tensor:
        """One forward pass over the ``name`` model's cache; ``real`` [B, T] marks the
        non-padding tokens. Returns logits [B, M, V] cut to the shared id range."""
        self._observe(name, batch, tokens, positions, real)
        logits = model(tokens, positions, batch.caches[name], logits_at, num_real=int(real.sum()))
        return logits[..., : self.pair.vocab_size]

    def _padded(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Right-padded tokens, positions 0.. and the real-token mask for a prefill."""
        width = max(1, max(len(r) for r in rows))
        device = self.pair.device
        tokens = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long, device=device)
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long, device=device)
        positions = torch.arange(width, device=device).expand(len(rows), width)
        return tokens, positions, positions < lengths.unsqueeze(1)

    def _prefill(self, batch: _Batch, prompts: list[list[int]], name: str, model: Qwen3Forward) -> None:
        """Cache every prompt token but the last (which the first step feeds)."""
        rows = [p[:-1] for p in prompts]
        if max(len(r) for r in rows) == 0:
            return
        tokens, positions, real = self._padded(rows)
        self._observe(name, batch, tokens, positions, real)
        model.fill(tokens, positions, batch.caches[name], num_real=int(real.sum()))

    def _prefill_and_sample(
        self, batch: _Batch, prompts: list[list[int]], name: str, model: Qwen3Forward
    ) -> list[list[int]]:
        """Plain decoding: cache the whole prompt and sample the first token from it."""
        tokens, positions, real = self._padded(prompts)
        last = (batch.seq_len - 1).unsqueeze(1)
        logits = self._feed(name, model, batch, tokens, positions, real, last)
        first = sample(probabilities(logits, batch.params)[:, 0], batch.rng.draw(1)[:, 0])
        batch.last_two = torch.stack([batch.last_two[:, 1], first], dim=1)
        batch.seq_len = batch.seq_len + 1
        return [[t] for t in first.tolist()]

    def _plain_step(self, batch: _Batch, name: str, model: Qwen3Forward) -> list[list[int]]:
        pending = batch.last_two[:, 1:]
        positions = (batch.seq_len - 1).unsqueeze(1)
        real = torch.ones_like(pending, dtype=torch.bool)
        logits = self._feed(name, model, batch, pending, positions, real, torch.zeros_like(positions))
        token = sample(probabilities(logits, batch.params)[:, 0], batch.rng.draw(1)[:, 0])
        batch.last_two = torch.stack([batch.last_two[:, 1], token], dim=1)
        batch.seq_len = batch.seq_len + 1
        return [[t] for t in token.tolist()]

    def _speculative_step(
        self,
        batch: _Batch,
        models: dict[str, Qwen3Forward],
        outputs: list[RowOutput],
        drafted: list[int],
        accepted: list[int],
    ) -> list[list[int]]:
        draft, target = models["draft"], models["target"]
        remaining = max(outputs[i].max_new_tokens - len(outputs[i].tokens) for i in batch.request_index)
        k = max(1, min(self.lookahead.k, remaining - 1))
        uniforms = batch.rng.draw(2 * k + 1)
        draft_uniforms, accept_uniforms, next_uniforms = (
            uniforms[:, :k],
            uniforms[:, k : 2 * k],
            uniforms[:, 2 * k],
        )
        pending_position = batch.seq_len - 1

        # Draft: catch up on a lagging token (if any), then propose k tokens.
        lag = batch.draft_lag
        if bool(lag.any()):
            first = torch.where(lag, batch.last_two[:, 0], batch.last_two[:, 1])
            tokens = torch.stack([first, batch.last_two[:, 1]], dim=1)
            base = pending_position - lag.long()
            positions = torch.stack([base, base + 1], dim=1)
            real = torch.stack([torch.ones_like(lag), lag], dim=1)
            logits_at = lag.long().unsqueeze(1)
        else:
            tokens = batch.last_two[:, 1:]
            positions = pending_position.unsqueeze(1)
            real = torch.ones_like(tokens, dtype=torch.bool)
            logits_at = torch.zeros_like(positions)
        draft_tokens: list[torch.Tensor] = []
        draft_probs: list[torch.Tensor] = []
        for i in range(k):
            if i > 0:
                tokens = draft_tokens[-1].unsqueeze(1)
                positions = (pending_position + i).unsqueeze(1)
                real = torch.ones_like(tokens, dtype=torch.bool)
                logits_at = torch.zeros_like(positions)
            logits = self._feed("draft", draft, batch, tokens, positions, real, logits_at)
            q = probabilities(logits, batch.params)[:, 0]
            draft_probs.append(q)
            draft_tokens.append(sample(q, draft_uniforms[:, i]))
        proposal = torch.stack(draft_tokens, dim=1)

        # Target: verify the pending token and all k proposals in one pass.
        verify_tokens = torch.cat([batch.last_two[:, 1:], proposal], dim=1)
        steps = torch.arange(k + 1, device=proposal.device)
        verify_positions = pending_position.unsqueeze(1) + steps
        logits = self._feed(
            "target",
            target,
            batch,
            verify_tokens,
            verify_positions,
            torch.ones_like(verify_tokens, dtype=torch.bool),
            steps.expand(len(batch.request_index), k + 1),
        )
        verdict = verify(
            proposal,
            torch.stack(draft_probs, dim=1),
            probabilities(logits, batch.params),
            accept_uniforms,
            next_uniforms,
        )
        n = verdict.accepted
        new_tokens = torch.cat([proposal, torch.zeros_like(proposal[:, :1])], dim=1)
        new_tokens.scatter_(1, n.unsqueeze(1), verdict.next_token.unsqueeze(1))
        before_next = verify_tokens.gather(1, n.unsqueeze(1)).squeeze(1)
        batch.last_two = torch.stack([before_next, verdict.next_token], dim=1)
        batch.seq_len = batch.seq_len + n + 1
        batch.draft_lag = n == k

        counts = n.tolist()
        self.lookahead.record(k * len(counts), sum(counts))
        rows = new_tokens.tolist()
        result = []
        for row, (index, count) in enumerate(zip(batch.request_index, counts, strict=True)):
            drafted[index] += k
            accepted[index] += count
            result.append(rows[row][: count + 1])
        return result

    def _commit(
        self,
        batch: _Batch,
        outputs: list[RowOutput],
        new_tokens: list[list[int]],
        on_step: StepObserver | None,
        finished: Callable[[int], None],
    ) -> None:
        """Apply stop rules, stream, hand over and drop the rows that finished."""
        keep = []
        done = []
        step: dict[int, list[int]] = {}
        for row, (index, tokens) in enumerate(zip(batch.request_index, new_tokens, strict=True)):
            out = outputs[index]
            kept = self._stop_rules.extend(out, tokens)
            if kept:
                step[index] = kept
            if out.finish_reason is None:
                keep.append(row)
            else:
                self._stop_rules.finish(out)
                done.append(index)
        if on_step is not None and step:
            on_step(step)
        for index in done:
            finished(index)
        if len(keep) < len(batch.request_index):
            self._keep_rows(batch, keep)

    def _keep_rows(self, batch: _Batch, rows: list[int]) -> None:
        """Compact the batch to ``rows``; the freed cache memory is reported at once."""
        batch.keep(rows)
        self._kv_tokens_held = len(rows) * batch.cache_length

    def _drop_cancelled(
        self,
        batch: _Batch,
        outputs: list[RowOutput],
        is_cancelled: Callable[[int], bool] | None,
        finished: Callable[[int], None],
    ) -> None:
        if is_cancelled is None:
            return
        keep = []
        for row, index in enumerate(batch.request_index):
            if is_cancelled(index):
                self._stop_rules.finish(outputs[index], "cancelled")
                finished(index)
            else:
                keep.append(row)
        if len(keep) < len(batch.request_index):
            self._keep_rows(batch, keep)

    # ---- multiple choice ------------------------------------------------------------

    def score_choices(self, prompts: Sequence[str], labels: Sequence[Sequence[str]]) -> list[ChoiceScores]:
        """For each prompt, the label the target finds most likely right after it (one prefill)."""
        with self._lock, torch.inference_mode():
            return score_choices(self.pair, prompts, labels)
