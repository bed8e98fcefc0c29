"""Closed forms the simulator is checked against."""

from __future__ import annotations


def theoretical_multibin_throughput(batch_size: int, num_bins: int, low: float, high: float) -> float:
    """Theorem 4.2 (Guldogan et al. 2024): requests per time unit with k equal-width bins, U(low, high)."""
    mean = (low + high) / 2.0
    b = batch_size
    return b / (mean + (b / (b + 1) * high + low / (b + 1) - mean) / num_bins)


def max_multibin_throughput(batch_size: int, low: float, high: float) -> float:
    """c_max = B / m: the k → ∞ limit of Theorem 4.2, every batch as long as its mean member."""
    return batch_size / ((low + high) / 2.0)
