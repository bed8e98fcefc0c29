"""Dynamic batch size (Pang et al. 2025): b_mem from free KV memory, b_SLA from measured latency.

Algorithm 1 (memory): the KV tokens a batch of b requests needs is a sum of b independent
per-request totals l_in + l_out; by the CLT it is about N(b·μ, b·σ²). Keeping the overflow
probability below ε_M means b·μ + θ·σ·√b ≤ η with θ = Φ⁻¹(1 − ε_M), i.e.
b_mem = ⌊(η − L0)/μ⌋ with the safety margin L0 = θ·σ·√b_mem. The largest such b is found
exactly from the quadratic in √b.

Algorithm 2 (SLA): a binary search over [b_low, b_high] steered by the moving average D̄ of
measured seconds per decoded token. D̄ above D_SLA + ε_D caps b_high at the size that was too
slow and widens b_low downwards by α; D̄ below D_SLA − ε_D lifts b_low to the size that was
fast enough and widens b_high upwards by α when the top of the interval was the size tested;
inside the band the interval shrinks to ±δ around the tested size. b_SLA is the midpoint.
The interval moves on the batch size actually run, so a lightly loaded server (small batches,
low latency) does not wind b_SLA up to sizes it never measured.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import NormalDist


class RunningStats:
    """Running mean and variance (Welford): numerically stable and O(1) per sample."""

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self._m2 = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self._m2 += delta * (value - self.mean)

    @property
    def variance(self) -> float:
        """Sample variance; 0 until two samples are seen."""
        return self._m2 / (self.count - 1) if self.count > 1 else 0.0


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


class SlaBatchController:
    """b_SLA: the feedback search of Algorithm 2 for one worker."""

    def __init__(
        self,
        d_sla_s: float,
        eps_d_s: float,
        alpha: int,
        delta: int,
        b_min: int,
        b_max: int,
        window: int,
    ) -> None:
        self._target = d_sla_s
        self._tolerance = eps_d_s
        self._alpha = alpha
        self._delta = delta
        self._b_min = b_min
        self._b_max = b_max
        self._latencies: deque[float] = deque(maxlen=window)
        self.b_low = b_min
        self.b_high = b_max
        self.b_sla = self._midpoint()

    @property
    def moving_latency_s(self) -> float | None:
        """D̄: mean of the last ``window`` measurements, None before the first."""
        return sum(self._latencies) / len(self._latencies) if self._latencies else None

    def update(self, seconds_per_token: float, batch_size: int) -> int:
        """Fold in one measurement taken at ``batch_size``; return the new b_SLA."""
        self._latencies.append(seconds_per_token)
        latency = self.moving_latency_s
        tested = min(max(batch_size, self._b_min), self._b_max)
        if latency > self._target + self._tolerance:
            self.b_high = max(self._b_min, min(self.b_high, tested - 1))
            self.b_low = max(self._b_min, min(self.b_low, self.b_high) - self._alpha)
        elif latency < self._target - self._tolerance:
            self.b_low = min(max(self.b_low, tested), self._b_max)
            self.b_high = min(self._b_max, max(self.b_high, tested + self._alpha))
        else:
            self.b_low = max(self._b_min, tested - self._delta)
            self.b_high = min(self._b_max, tested + self._delta)
        self.b_sla = self._midpoint()
        return self.b_sla

    def _midpoint(self) -> int:
        return (self.b_low + self.b_high + 1) // 2
