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


@dataclass
class SamplingParams:
    """Per-row sampling settings as tensors [B] on the decoding device."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor

    @classmethod
    def from_lists(
        cls, temperature: Sequence[float], top_p: Sequence[float], top_k: Sequence[int], device: torch.device
    ) -> SamplingParams:
        return cls(
            temperature=torch.tensor(list(temperature), dtype=torch.float32, device=device),
            top_p=torch.tensor(list(top_p), dtype=torch.float32, device=device),
            top_k=torch.tensor(list(top_k), dtype=torch.long, device=device),
        )

    def keep_rows(self, rows: torch.Tensor) -> SamplingParams:
        return SamplingParams(self.temperature[rows], self.top_p[rows], self.top_k[rows])


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Distributions [B, M, V] from logits [B, M, V] under each row's settings."""
    compute_dtype = torch.promote_types(logits.dtype, torch.float32)
    logits = logits.to(compute_dtype)
    vocab = logits.shape[-1]
    greedy = (params.temperature == 0).view(-1, 1, 1)
    one_hot = torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    if bool(greedy.all()):
        return one_hot
    temperature = torch.where(params.temperature > 0, params.temperature, 1.0).to(compute_dtype)
    scaled = logits / temperature.view(-1, 1, 1)
    top_k = params.top_k.view(-1, 1, 1)
    if bool((top_k > 0).any()):
        kth_index = (top_k.clamp(1, vocab) - 1).expand(-1, scaled.shape[1], 1)
        kth_value = scaled.sort(-1, descending=True).values.gather(-1, kth_index)
        scaled = scaled.masked_fill((top_k > 0) & (scaled < kth_value), float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    top_p = params.top_p.to(compute_dtype).view(-1, 1, 1)
    if bool((top_p < 1).any()):
        sorted_probs, order = probs.sort(-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = (mass_before >= top_p) & (top_p < 1)
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
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
