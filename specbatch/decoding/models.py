"""A Qwen3 forward pass of our own over the Hugging Face weights.

Why not call the Hugging Face module directly: decoding needs a KV cache in blocks
addressed by position per row, so that a rejected draft token costs nothing (the next
step simply overwrites its slot), rows of different lengths share one batch without
cache surgery, and a row that leaves frees its blocks without moving anyone else's.
The Hugging Face model stays the reference (a unit test compares logits). The
weights are the Hugging Face module's own tensors: nothing is copied.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specbatch.decoding.kv_blocks import KVLayout, KVStore

# Speculative steps may write a few draft tokens past a row's last allowed position
# (they are discarded); the RoPE table covers them.
ROPE_MARGIN = 16


@dataclass(frozen=True)
class _LayerWeights:
    input_norm: torch.Tensor
    q_proj: torch.Tensor
    k_proj: torch.Tensor
    v_proj: torch.Tensor
    o_proj: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    post_norm: torch.Tensor
    gate_proj: torch.Tensor
    up_proj: torch.Tensor
    down_proj: torch.Tensor


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32 (or wider) exactly as Qwen3RMSNorm does."""
    compute_dtype = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(compute_dtype)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Qwen3Forward:
    """Batched Qwen3 forward over a position-indexed KV cache.

    Each call feeds ``tokens[b, t]`` at ``positions[b, t]``. Keys and values are
    written to cache slot ``positions[b, t]`` of row ``b`` before attention, and a query
    at position ``p`` attends to slots ``0..p`` of its own row, so whatever a slot beyond
    ``p`` holds (a rejected draft, padding) is never read.
    """

    def __init__(self, hf_model: torch.nn.Module) -> None:
        config = hf_model.config
        self.config = config
        self.num_layers: int = config.num_hidden_layers
        self.num_heads: int = config.num_attention_heads
        self.num_kv_heads: int = config.num_key_value_heads
        self.head_dim: int = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.eps: float = config.rms_norm_eps
        self.max_positions: int = config.max_position_embeddings
        body = hf_model.model
        self.embed = body.embed_tokens.weight
        self.final_norm = body.norm.weight
        self.lm_head = hf_model.lm_head.weight
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        self.layers = [
            _LayerWeights(
                input_norm=layer.input_layernorm.weight,
                q_proj=layer.self_attn.q_proj.weight,
                k_proj=layer.self_attn.k_proj.weight,
                v_proj=layer.self_attn.v_proj.weight,
                o_proj=layer.self_attn.o_proj.weight,
                q_norm=layer.self_attn.q_norm.weight,
                k_norm=layer.self_attn.k_norm.weight,
                post_norm=layer.post_attention_layernorm.weight,
                gate_proj=layer.mlp.gate_proj.weight,
                up_proj=layer.mlp.up_proj.weight,
                down_proj=layer.mlp.down_proj.weight,
            )
            for layer in body.layers
        ]
        if getattr(config, "attention_bias", False):
            raise ValueError("Qwen3 checkpoints with attention biases are not supported")
        rope = config.rope_parameters if hasattr(config, "rope_parameters") else None
        rope = rope or {"rope_type": "default", "rope_theta": getattr(config, "rope_theta", 1e6)}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"rope_type {rope['rope_type']!r} is not supported; only the default RoPE is")
        inv_freq = 1.0 / (
            rope["rope_theta"] ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        )
        freqs = torch.outer(torch.arange(self.max_positions + ROPE_MARGIN, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1).to(self.device)
        self._cos = emb.cos().to(self.dtype)
        self._sin = emb.sin().to(self.dtype)
        self.tokens_fed = 0

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one cached token occupies: keys and values of every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.embed.element_size()

    def new_store(self, num_slots: int) -> KVStore:
        """Keys and values for ``num_slots`` token slots of this model."""
        return KVStore.allocate(
            num_layers=self.num_layers,
            num_slots=num_slots,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            dtype=self.dtype,
            device=self.device,
        )

    def fill(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        store: KVStore,
        layout: KVLayout,
        num_real: int | None = None,
    ) -> None:
        """Cache ``tokens`` [B, T] at ``positions`` [B, T] without computing any logits."""
        self._hidden(tokens, positions, store, layout, num_real)

    def __call__(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        store: KVStore,
        layout: KVLayout,
        logits_at: torch.Tensor,
        num_real: int | None = None,
    ) -> torch.Tensor:
        """Feed ``tokens`` [B, T] at ``positions`` [B, T]; return logits [B, M, V] at the
        time indices ``logits_at`` [B, M]. ``num_real`` (real, non-padding tokens in the
        call) feeds the ``tokens_fed`` counter; default B*T."""
        hidden = self._hidden(tokens, positions, store, layout, num_real)
        picked = hidden.gather(1, logits_at.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        return F.linear(_rms_norm(picked, self.final_norm, self.eps), self.lm_head)

    def _hidden(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        store: KVStore,
        layout: KVLayout,
        num_real: int | None,
    ) -> torch.Tensor:
        """The last layer's hidden states [B, T, H], writing keys and values into ``store``."""
        batch, steps = tokens.shape
        self.tokens_fed += batch * steps if num_real is None else num_real
        span = layout.read_slots.shape[1]
        cos = self._cos[positions].unsqueeze(1)
        sin = self._sin[positions].unsqueeze(1)
        slot_ids = torch.arange(span, device=positions.device)
        mask = slot_ids.view(1, 1, 1, span) <= positions.view(batch, 1, steps, 1)
        write = layout.write_slots.reshape(-1)
        read = layout.read_slots

        hidden = F.embedding(tokens, self.embed)
        for index, w in enumerate(self.layers):
            normed = _rms_norm(hidden, w.input_norm, self.eps)
            q = F.linear(normed, w.q_proj).view(batch, steps, self.num_heads, self.head_dim)
            k = F.linear(normed, w.k_proj).view(batch, steps, self.num_kv_heads, self.head_dim)
            v = F.linear(normed, w.v_proj).view(batch, steps, self.num_kv_heads, self.head_dim)
            q = _rms_norm(q, w.q_norm, self.eps).transpose(1, 2)
            k = _rms_norm(k, w.k_norm, self.eps).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            keys, values = store.keys[index], store.values[index]
            keys[write] = k.transpose(1, 2).reshape(-1, self.num_kv_heads, self.head_dim)
            values[write] = v.reshape(-1, self.num_kv_heads, self.head_dim)
            attn = F.scaled_dot_product_attention(
                q, keys[read].transpose(1, 2), values[read].transpose(1, 2), attn_mask=mask, enable_gqa=True
            )
            hidden = hidden + F.linear(attn.transpose(1, 2).reshape(batch, steps, -1), w.o_proj)
            normed = _rms_norm(hidden, w.post_norm, self.eps)
            hidden = hidden + F.linear(
                F.silu(F.linear(normed, w.gate_proj)) * F.linear(normed, w.up_proj), w.down_proj
            )
        return hidden
