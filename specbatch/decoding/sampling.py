"""Turning logits into the distributions both models sample from, and sampling them.

Speculative sampling is only exact if the draft's q and the target's p are
transformed by the same penalties, temperature, top-k and top-p, so one function does
it for both (the penalties count, at each position, the drafts before it as output).
Greedy rows (temperature 0) become one-hot distributions at the argmax: the acceptance
rule min(1, p/q) and the residual max(0, p - q) then reduce exactly to "accept while
the draft agrees with the target's argmax, else take that argmax",
and greedy and sampled rows share one code path in a batch.

Two exact ways to draw, both keyed by (seed, position) through
:mod:`specbatch.decoding.counter_random`:
- an unseeded row samples by inverse CDF and is verified with min(1, p/q) and the
  residual (Leviathan et al.), which accepts the most draft tokens;
- a seeded row samples by Gumbel-max with noise fixed per (seed, position, token):
  the draft proposes argmax(log q + g) and the target keeps argmax(log p + g), so the
  committed token at every position is the target's own Gumbel-max draw, whatever K,
  batch or draft produced it. A seeded row therefore reproduces token for token in
  any batch, under any lookahead, after a preemption and in target-only decoding,
  at the price of a lower acceptance than the residual rule (drafter-invariant
  speculative decoding: Daliri, Musco and Suresh, 2024).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specbatch.decoding import counter_random
from specbatch.decoding.thresholds import top_k_keep, top_p_keep
from specbatch.logprobs import MAX_LOGPROBS

NO_PENALTIES = (0.0, 0.0, 1.0)  # presence, frequency, repetition


@dataclass
class LogitBias:
    """Per-row additions to the logits of chosen tokens (OpenAI's logit_bias): token ids
    [B, L] and what to add [B, L], padded with the id ``vocab`` (added nowhere)."""

    ids: torch.Tensor
    values: torch.Tensor


def biased(logits: torch.Tensor, bias: LogitBias) -> torch.Tensor:
    """Logits [B, M, V] with each row's bias added at every position."""
    batch, vocab = logits.shape[0], logits.shape[-1]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    dense = logits.new_zeros(batch, vocab + 1).scatter_add(1, bias.ids, bias.values.to(logits.dtype))
    return logits + dense[:, :vocab].unsqueeze(1)


@dataclass
class EndMask:
    """What vLLM's min_tokens bans: per row the tokens that would end it ``ids`` [B, E]
    (its end-of-sequence tokens unless it ignores them, and its stop tokens), padded with
    the id ``vocab`` (banned nowhere), and ``until`` [B], the first sequence position a
    token of them may land at (the row's prompt length plus its min_tokens)."""

    ids: torch.Tensor
    until: torch.Tensor


def ends_masked(logits: torch.Tensor, mask: EndMask, positions: torch.Tensor) -> torch.Tensor:
    """Logits [B, M, V] with each row's end tokens at -inf wherever the token drawn from
    position m would land before ``mask.until`` (``positions`` [B, M]: where it lands).
    Draft and target alike are masked, so the proposals never hold a banned token and
    verification stays exact against the masked target."""
    batch, vocab = logits.shape[0], logits.shape[-1]
    is_end = torch.zeros(batch, vocab + 1, dtype=torch.bool, device=logits.device)
    is_end = is_end.scatter(1, mask.ids, True)[:, :vocab]
    early = positions < mask.until.unsqueeze(1)
    return logits.masked_fill(is_end.unsqueeze(1) & early.unsqueeze(-1), float("-inf"))


@dataclass
class PenaltyTensors:
    """What the penalties of a step's rows read, as tensors on the decoding device.

    The penalties [B] per row; the row's output so far [B, O] and (for the repetition
    penalty) its prompt [B, P] as token ids, padded with the id ``vocab``, which counts
    for no token; ``step_tokens`` [B, T]: the tokens this step proposed before the one
    being drawn (a draft's earlier proposals), which count as output too."""

    presence: torch.Tensor
    frequency: torch.Tensor
    repetition: torch.Tensor
    output_ids: torch.Tensor
    prompt_ids: torch.Tensor
    step_tokens: torch.Tensor


def penalized(
    logits: torch.Tensor, penalties: PenaltyTensors, step_counts: torch.Tensor, repetition: bool
) -> torch.Tensor:
    """Logits [B, M, V] after vLLM's penalties, in its order: the repetition penalty
    divides the positive logits and multiplies the negative ones of every token in the
    prompt or the output, then the frequency penalty subtracts per occurrence in the
    output and the presence penalty once per token that occurs. ``step_counts`` [B, M, V]
    are the occurrences each position adds to the output so far (tokens of this step
    before it). Draft and target alike are penalized here, so a draft's proposals stay
    likely under the target and verification stays exact against the penalized target."""
    batch, vocab = logits.shape[0], logits.shape[-1]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    ones = torch.ones_like(penalties.output_ids, dtype=logits.dtype)
    counts = logits.new_zeros(batch, vocab + 1).scatter_add(1, penalties.output_ids, ones)[:, :vocab]
    counts = counts.unsqueeze(1) + step_counts
    in_output = counts > 0
    if repetition:
        in_prompt = torch.zeros(batch, vocab + 1, dtype=torch.bool, device=logits.device)
        in_prompt = in_prompt.scatter(1, penalties.prompt_ids, True)[:, :vocab].unsqueeze(1)
        factor = torch.where(in_prompt | in_output, penalties.repetition.view(-1, 1, 1).to(logits.dtype), 1.0)
        logits = torch.where(logits > 0, logits / factor, logits * factor)
    logits = logits - penalties.frequency.view(-1, 1, 1).to(logits.dtype) * counts
    return logits - penalties.presence.view(-1, 1, 1).to(logits.dtype) * in_output


def counts_before(tokens: torch.Tensor, first: int, positions: int, vocab: int) -> torch.Tensor:
    """[B, positions, vocab]: at position j, the occurrences of each token in
    ``tokens[:, :first + j]`` ([B, T]; ids past the vocabulary count for none). Dense, as
    the logits are: a verify step of K = 8 holds 5.5 MB of counts per row on Qwen3's
    151,936-token vocabulary, only in steps where some row has a penalty."""
    batch, width = tokens.shape
    ones = torch.ones(batch, width, 1, device=tokens.device)
    each = torch.zeros(batch, width, vocab + 1, device=tokens.device).scatter(2, tokens.unsqueeze(-1), ones)
    running = torch.cat([each.new_zeros(batch, 1, vocab + 1), each.cumsum(1)], dim=1)
    return running[:, first : first + positions, :vocab]


@dataclass
class SamplingTensors:
    """The sampling settings of a step's rows as tensors [B] on the decoding device.

    A request carries its settings as plain values; a step gathers those of the rows it
    runs into these tensors, so every transform is one batched operation."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    min_p: torch.Tensor | None = None  # None where no row of the step filters by min_p

    @classmethod
    def from_lists(
        cls,
        temperature: Sequence[float],
        top_p: Sequence[float],
        top_k: Sequence[int],
        device: torch.device,
        min_p: Sequence[float] | None = None,
    ) -> SamplingTensors:
        return cls(
            temperature=torch.tensor(list(temperature), dtype=torch.float32, device=device),
            top_p=torch.tensor(list(top_p), dtype=torch.float32, device=device),
            top_k=torch.tensor(list(top_k), dtype=torch.long, device=device),
            min_p=None if min_p is None else torch.tensor(list(min_p), dtype=torch.float32, device=device),
        )

    def keep_rows(self, rows: torch.Tensor) -> SamplingTensors:
        min_p = None if self.min_p is None else self.min_p[rows]
        return SamplingTensors(self.temperature[rows], self.top_p[rows], self.top_k[rows], min_p)


@dataclass(frozen=True)
class SamplingFeatures:
    """Which transforms a batch needs at all, known on the host from the requests.

    The step functions branch on these Python values instead of testing tensors (a
    ``bool(tensor)`` would wait for the device); a compiler specialises on them, so a
    greedy batch runs without the filters and a batch without seeded rows without the
    Gumbel noise. ``top_k_bound``: 0 (no top-k) or a power of two at least every
    row's top_k; ``top_p_candidates``: how many tokens top-p must order (the top-k
    bound when every top-p row also has a top-k, else 0 for the whole vocabulary).
    ``logprobs``: None when no row reports log-probabilities, else how many
    alternatives per token the step computes (0, or the most any row may ask for).
    ``logit_bias``: some row adds a bias to the logits of chosen tokens (first, then the
    penalties); ``min_p``: some sampled row drops the tokens less likely than min_p
    times the likeliest one (vLLM's min_p, after temperature and before top-k and top-p);
    ``penalties``: some row has a presence, frequency or repetition penalty;
    ``repetition``: some row has a repetition penalty (which also reads its prompt);
    ``end_mask``: some row has not yet made its min_tokens, so its end tokens are banned."""

    sampled: bool = False  # some row has temperature > 0
    top_k_bound: int = 0
    top_p: bool = False  # some sampled row filters by top-p
    top_p_candidates: int = 0
    coupled: bool = False  # some row draws by Gumbel coupling
    logprobs: int | None = None
    logit_bias: bool = False
    min_p: bool = False
    penalties: bool = False
    repetition: bool = False
    end_mask: bool = False

    @classmethod
    def of(
        cls,
        temperature: Sequence[float],
        top_p: Sequence[float],
        top_k: Sequence[int],
        coupled: Sequence[bool],
        vocab: int,
        logprobs: Sequence[int | None] = (),
        penalties: Sequence[tuple[float, float, float]] = (),
        min_p: Sequence[float] = (),
        logit_bias: Sequence[Sequence[tuple[int, float]]] = (),
        short_of_min_tokens: Sequence[bool] = (),
    ) -> SamplingFeatures:
        """``penalties``: per row (presence, frequency, repetition); none: (0, 0, 1).
        ``short_of_min_tokens``: per row, whether it has made fewer tokens than its
        min_tokens. ``logprobs``, ``penalties``, ``min_p``, ``logit_bias`` and
        ``short_of_min_tokens`` may be left empty: no row asks."""
        rows = [(p, k) for t, p, k in zip(temperature, top_p, top_k, strict=True) if t > 0]
        largest_k = max((k for _, k in rows), default=0)
        bound = min(vocab, 1 << (largest_k - 1).bit_length()) if largest_k else 0
        nucleus = [k for p, k in rows if p < 1]
        return cls(
            sampled=bool(rows),
            top_k_bound=bound,
            top_p=bool(nucleus),
            top_p_candidates=bound if nucleus and all(k > 0 for k in nucleus) else 0,
            coupled=any(coupled),
            logprobs=_logprobs_width(logprobs, vocab),
            penalties=any(p != NO_PENALTIES for p in penalties),
            repetition=any(r != 1.0 for _, _, r in penalties),
            min_p=any(m > 0 and t > 0 for t, m in zip(temperature, min_p, strict=False)),
            logit_bias=any(logit_bias),
            end_mask=any(short_of_min_tokens),
        )


def _logprobs_width(logprobs: Sequence[int | None], vocab: int) -> int | None:
    """Alternatives a step computes per token: one width for any row that asks some, so a
    compiler traces two variants at most, not one per requested count."""
    asked = [n for n in logprobs if n is not None]
    if not asked:
        return None
    return min(vocab, MAX_LOGPROBS) if max(asked) > 0 else 0


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, alternatives: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities of ``tokens`` [B, M] under raw ``logits`` [B, M, V] (no
    temperature, no filters), and the ``alternatives`` most likely tokens at each
    position: (chosen [B, M], top values [B, M, A], top ids [B, M, A])."""
    log_probs = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    chosen = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    top_values, top_ids = log_probs.topk(alternatives, dim=-1)
    return chosen, top_values, top_ids


def probabilities(
    logits: torch.Tensor, params: SamplingTensors, features: SamplingFeatures | None = None
) -> torch.Tensor:
    """Distributions [B, M, V] from logits [B, M, V] under each row's settings;
    ``features`` may leave out transforms no row of the batch uses (default: every
    transform, the whole vocabulary as candidates)."""
    if features is None:
        vocab = logits.shape[-1]
        features = SamplingFeatures(
            sampled=True, top_k_bound=vocab, top_p=True, coupled=True, min_p=params.min_p is not None
        )
    compute_dtype = torch.promote_types(logits.dtype, torch.float32)
    logits = logits.to(compute_dtype)
    one_hot = torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    if not features.sampled:
        return one_hot
    greedy = (params.temperature == 0).view(-1, 1, 1)
    temperature = torch.where(params.temperature > 0, params.temperature, 1.0).to(compute_dtype)
    scaled = logits / temperature.view(-1, 1, 1)
    if features.min_p:
        likeliest = torch.softmax(scaled, dim=-1)
        floor = params.min_p.to(compute_dtype).view(-1, 1, 1) * likeliest.amax(-1, keepdim=True)
        scaled = scaled.masked_fill(likeliest < floor, float("-inf"))
    if features.top_k_bound:
        top_k = params.top_k.view(-1, 1, 1)
        keep = top_k_keep(scaled, top_k, features.top_k_bound)
        scaled = scaled.masked_fill((top_k > 0) & ~keep, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if features.top_p:
        top_p = params.top_p.to(compute_dtype).view(-1, 1, 1)
        keep = top_p_keep(probs, top_p, features.top_p_candidates)
        probs = probs.masked_fill((top_p < 1) & ~keep, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return torch.where(greedy, one_hot, probs)


def sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sample of each row of ``probs`` [B, V] with ``uniforms`` [B] in [0, 1).

    Zero-probability tokens are never chosen; an unnormalised row is fine."""
    cdf = probs.to(torch.float64).cumsum(-1)
    threshold = (uniforms.to(torch.float64) * cdf[:, -1]).unsqueeze(-1)
    picked = torch.searchsorted(cdf, threshold, right=True).squeeze(-1)
    return picked.clamp_max(probs.shape[-1] - 1)


def gumbel_argmax(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The Gumbel-max draw argmax(log p + g) over the last axis: an exact sample of
    ``probs`` that, for a fixed ``noise``, depends on nothing else (zero-probability
    tokens have log p = -inf and are never chosen)."""
    return (probs.to(torch.float64).log() + noise).argmax(-1)


def draw(
    probs: torch.Tensor,
    seeds: torch.Tensor,
    coupled: torch.Tensor,
    position: torch.Tensor,
    purpose: int,
    features: SamplingFeatures,
) -> torch.Tensor:
    """One token per row from ``probs`` [B, V] for the token at ``position`` [B]:
    Gumbel-max for ``coupled`` rows, inverse CDF for the others (the argmax of a
    one-hot row either way)."""
    if not features.sampled:
        return probs.argmax(-1)
    uniform = counter_random.uniforms(seeds, position.unsqueeze(1), purpose)[:, 0]
    drawn = sample(probs, uniform)
    if features.coupled:
        noise = counter_random.gumbel_noise(seeds, position.unsqueeze(1), probs.shape[-1])
        drawn = torch.where(coupled, gumbel_argmax(probs.unsqueeze(1), noise)[:, 0], drawn)
    return drawn
