"""b_mem for a whole batch: Algorithm 1 of Pang et al. (2025), as the static policy applies it.

The KV tokens a batch of b requests needs is a sum of b independent per-request totals
l_in + l_out; by the CLT it is about N(b·μ, b·σ²). Keeping the overflow probability below
ε_M means b·μ + θ·σ·√b ≤ η with θ = Φ⁻¹(1 − ε_M), i.e. b_mem = ⌊(η − L0)/μ⌋ with the safety
margin L0 = θ·σ·√b_mem. The largest such b is found exactly from the quadratic in √b.

The admission policy the server runs does not size batches: it applies the same CLT margin
to the error of its length predictions, row by row, on the blocks an instance reports free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist


@dataclass(frozen=True)
class MemoryBound:
    """Result of Algorithm 1: the batch size and the CLT margin L0 (tokens) it reserved."""

    b_mem: int
    margin_tokens: float


def memory_batch_size(
    free_kv_tokens: float,
    mean_tokens: float,
    variance_tokens: float,
    eps_mem: float,
    b_min: int,
    b_max: int,
) -> MemoryBound:
    """b_mem = ⌊(η − L0)/(E[l_in] + E[l_out])⌋ clamped to [b_min, b_max] (Algorithm 1).

    ``mean_tokens``/``variance_tokens`` are the running statistics of l_in + l_out per request.
    """
    if mean_tokens <= 0:
        return MemoryBound(b_max, 0.0)
    theta = NormalDist().inv_cdf(1.0 - eps_mem)
    sigma = math.sqrt(max(variance_tokens, 0.0))

    def fits(b: int) -> bool:
        return b * mean_tokens + theta * sigma * math.sqrt(b) <= free_kv_tokens

    capacity = max(free_kv_tokens, 0.0)
    root = -theta * sigma + math.sqrt((theta * sigma) ** 2 + 4.0 * mean_tokens * capacity)
    b = max(0, math.floor((root / (2.0 * mean_tokens)) ** 2))
    while fits(b + 1):
        b += 1
    while b > 0 and not fits(b):
        b -= 1
    clamped = min(max(b, b_min), b_max)
    return MemoryBound(clamped, theta * sigma * math.sqrt(b))
