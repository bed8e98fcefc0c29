"""Exact top-k and top-p cut-offs without sorting the whole vocabulary where possible.

Both filters only need one threshold per position: top-k keeps the values at or above
the k-th largest, top-p keeps the most probable tokens until their mass reaches p.
Top-k takes ``torch.topk`` of the batch's largest k (a partial selection, known on the
host from the requests) instead of a full sort; top-p after top-k only has those k
candidates to order, since every other token already has probability zero. Only a
row filtered by top-p alone needs the full sort. Shapes stay static (the bounds are
Python ints a compiler specialises on), so the filters compile into the step.
"""

from __future__ import annotations

import torch


def top_k_keep(scaled: torch.Tensor, top_k: torch.Tensor, bound: int) -> torch.Tensor:
    """Mask [..., V] of the values at or above each row's ``top_k``-th largest (ties at
    the threshold kept); ``top_k`` broadcasts against ``scaled[..., :1]``, and no row's
    ``top_k`` exceeds ``bound`` (<= V)."""
    largest = scaled.topk(bound, dim=-1).values  # descending
    index = (top_k.clamp(1, bound) - 1).expand(*scaled.shape[:-1], 1)
    return scaled >= largest.gather(-1, index)


def top_p_keep(probs: torch.Tensor, top_p: torch.Tensor, candidates: int) -> torch.Tensor:
    """Mask [..., V] of the nucleus: the most probable tokens while the mass before
    them is below ``top_p``. ``candidates`` > 0: only that many tokens can be non-zero
    (a top-k bound), so only they are ordered; 0: the whole vocabulary is sorted."""
    if candidates:
        ordered = probs.topk(candidates, dim=-1).values
    else:
        ordered = probs.sort(dim=-1, descending=True).values
    mass_before = ordered.cumsum(-1) - ordered
    kept = (mass_before < top_p).sum(-1, keepdim=True).clamp_min(1)
    return probs >= ordered.gather(-1, kept - 1)
