"""Attention of fed tokens over their rows' gathered KV slots, masked by position.

A query at position p reads slots 0..p of its own row. Neither backend materialises
a boolean mask or repeats grouped-query heads in memory:
- ``grouped``: the query heads sharing one KV head are folded into the query length
  ([B, kv_heads, group * T, D] against [B, kv_heads, S, D]), so one matmul serves the
  whole group; the position test is an elementwise ``where`` that torch.compile fuses
  into the softmax. Runs in any dtype on any device (float64 included, which the
  exactness tests need and FlexAttention's CPU kernel lacks).
- ``flex``: ``torch.nn.attention.flex_attention`` with the position test as a
  ``mask_mod`` and ``enable_gqa``; its block mask skips whole KV blocks past a row's
  last position, and on CUDA the decoding kernel reads each KV head once per group.
  Only worth it compiled (eager FlexAttention computes the full score matrix).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ATTENTION_BACKENDS = ("grouped", "flex")

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def grouped_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """``q`` [B, H, T, D], ``keys``/``values`` [B, kv_heads, S, D], ``positions`` [B, T]
    -> [B, H, T, D]; query heads h*group..h*group+group-1 share KV head h (Qwen3's order)."""
    batch, heads, steps, dim = q.shape
    kv_heads, span = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    scores = torch.matmul(q.reshape(batch, kv_heads, group * steps, dim), keys.transpose(-1, -2))
    scores = scores.view(batch, kv_heads, group, steps, span) * dim**-0.5
    slots = torch.arange(span, device=q.device)
    visible = slots.view(1, 1, 1, 1, span) <= positions.view(batch, 1, 1, steps, 1)
    scores = torch.where(visible, scores, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
    out = torch.matmul(weights.view(batch, kv_heads, group * steps, span), values)
    return out.view(batch, heads, steps, dim)


def flex_attention_by_position(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Same contract as :func:`grouped_attention`, through FlexAttention."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    batch, _, steps, _ = q.shape
    span = keys.shape[2]

    def up_to_position(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor):
        return kv_idx <= positions[b, q_idx]

    block_mask = create_block_mask(up_to_position, batch, None, steps, span, device=q.device)
    return flex_attention(q, keys, values, block_mask=block_mask, enable_gqa=True)


def attention_backend(name: str) -> Attention:
    """The attention function called ``name`` (one of :data:`ATTENTION_BACKENDS`)."""
    if name == "grouped":
        return grouped_attention
    if name == "flex":
        return flex_attention_by_position
    raise ValueError(f"attention must be one of {ATTENTION_BACKENDS}, got {name!r}")
