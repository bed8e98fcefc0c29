"""Turning logits into the distributions both models sample from, and sampling them.

Speculative sampling is only exact if the draft's q and the target's p are
transformed by the same temperature, top-k and top-p, so one function does it for
both. Greedy rows (temperature 0) become one-hot distributions at the argmax: the
acceptance rule min(1, p/q) and the residual max(0, p - q) then reduce exactly to
"accept while the draft agrees with the target's argmax, else take that argmax",
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


@dataclass
class SamplingTensors:
    """The sampling settings of a step's rows as tensors [B] on the decoding device.

    A request carries its settings as plain values; a step gathers those of the rows it
    runs into these tensors, so every transform is one batched operation."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor

    @classmethod
    def from_lists(
        cls, temperature: Sequence[float], top_p: Sequence[float], top_k: Sequence[int], device: torch.device
    ) -> SamplingTensors:
        return cls(
            temperature=torch.tensor(list(temperature), dtype=torch.float32, device=device),
            top_p=torch.tensor(list(top_p), dtype=torch.float32, device=device),
            top_k=torch.tensor(list(top_k), dtype=torch.long, device=device),
        )

    def keep_rows(self, rows: torch.Tensor) -> SamplingTensors:
        return SamplingTensors(self.temperature[rows], self.top_p[rows], self.top_k[rows])


@dataclass(frozen=True)
class SamplingFeatures:
    """Which transforms a batch needs at all, known on the host from the requests.

    The step functions branch on these Python values instead of testing tensors (a
    ``bool(tensor)`` would wait for the device); a compiler specialises on them, so a
    greedy batch runs without the filters and a batch without seeded rows without the
    Gumbel noise. ``top_k_bound``: 0 (no top-k) or a power of two at least every
    row's top_k; ``top_p_candidates``: how many tokens top-p must order (the top-k
    bound when every top-p row also has a top-k, else 0 for the whole vocabulary)."""

    sampled: bool = False  # some row has temperature > 0
    top_k_bound: int = 0
    top_p: bool = False  # some sampled row filters by top-p
    top_p_candidates: int = 0
    coupled: bool = False  # some row draws by Gumbel coupling

    @classmethod
    def of(
        cls,
        temperature: Sequence[float],
        top_p: Sequence[float],
        top_k: Sequence[int],
        coupled: Sequence[bool],
        vocab: int,
    ) -> SamplingFeatures:
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
        )


def probabilities(
    logits: torch.Tensor, params: SamplingTensors, features: SamplingFeatures | None = None
) -> torch.Tensor:
    """Distributions [B, M, V] from logits [B, M, V] under each row's settings;
    ``features`` may leave out transforms no row of the batch uses (default: every
    transform, the whole vocabulary as candidates)."""
    if features is None:
        vocab = logits.shape[-1]
        features = SamplingFeatures(sampled=True, top_k_bound=vocab, top_p=True, coupled=True)
    compute_dtype = torch.promote_types(logits.dtype, torch.float32)
    logits = logits.to(compute_dtype)
    one_hot = torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    if not features.sampled:
        return one_hot
    greedy = (params.temperature == 0).view(-1, 1, 1)
    temperature = torch.where(params.temperature > 0, params.temperature, 1.0).to(compute_dtype)
    scaled = logits / temperature.view(-1, 1, 1)
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
