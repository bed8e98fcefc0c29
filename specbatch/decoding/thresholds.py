"""Exact top-k and top-p cut-offs found by bisection instead of a sort.

Sorting every position's vocabulary (151,936 ids for Qwen3) to find one threshold
writes the whole sorted copy and its index permutation. Both filters only need a
threshold value: top-k keeps the values at or above the k-th largest, top-p keeps a
token when the mass of strictly more probable tokens is below p. Each threshold is
found exactly by bisection over the float's bit pattern (read as an integer that
orders like the float): one pass per bit, each a fused compare-and-reduce over the
vocabulary with no writes, a fixed number of passes, no host synchronisation and no
data-dependent shapes, so it compiles into the step and CUDA graphs capture it.
"""

from __future__ import annotations

import torch

_INT_OF = {torch.float32: torch.int32, torch.float64: torch.int64}


def ordered_keys(values: torch.Tensor) -> torch.Tensor:
    """Integers that compare exactly like ``values`` (float32 or float64)."""
    bits = values.view(_INT_OF[values.dtype])
    sign_clear = torch.iinfo(bits.dtype).max
    return torch.where(bits >= 0, bits, bits ^ sign_clear)


def _midpoint(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """floor((low + high) / 2) without overflow."""
    return (low >> 1) + (high >> 1) + (low & high & 1)


def top_k_keep(scaled: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Mask [..., V] of the values at or above each row's ``top_k``-th largest
    (ties at the threshold kept, as a sort-based filter keeps them); ``top_k`` broadcasts
    against ``scaled[..., :1]`` and is clamped to 1..V."""
    keys = ordered_keys(scaled)
    wanted = top_k.clamp(1, scaled.shape[-1])
    low = keys.amin(-1, keepdim=True)  # at least k values are >= low
    high = keys.amax(-1, keepdim=True) + 1  # fewer than k values are >= high
    for _ in range(keys.element_size() * 8):
        middle = _midpoint(low, high)
        enough = (keys >= middle).sum(-1, keepdim=True) >= wanted
        low = torch.where(enough, middle, low)
        high = torch.where(enough, high, middle)
    return keys >= low


def top_p_keep(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask [..., V] of the tokens whose strictly more probable tokens hold less than
    ``top_p`` of the mass (the nucleus; ``probs`` non-negative, ``top_p`` broadcasts)."""
    keys = ordered_keys(probs)
    low = torch.full_like(keys[..., :1], -1)  # the mass above low reaches top_p
    high = keys.amax(-1, keepdim=True)  # nothing lies above high
    for _ in range(keys.element_size() * 8):
        middle = _midpoint(low, high)
        below = torch.where(keys > middle, probs, 0.0).sum(-1, keepdim=True) < top_p
        high = torch.where(below, middle, high)
        low = torch.where(below, low, middle)
    return keys >= high
