"""Preallocated, position-indexed KV cache (one per model per batch).

Slot ``p`` of row ``b`` holds the key/value of that row's token at position ``p``.
Nothing is ever cropped: a row rolls back by simply feeding its next token at the
rolled-back position, which overwrites the stale slot before any query can see it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @classmethod
    def allocate(
        cls,
        *,
        num_layers: int,
        batch: int,
        num_kv_heads: int,
        length: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> KVCache:
        shape = (batch, num_kv_heads, length, head_dim)
        return cls(
            keys=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
            values=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
        )

    @property
    def batch(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0

    @property
    def length(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Drop every row not in ``rows`` (finished or cancelled), so they stop costing compute."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
