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

from specbatch.decoding.attention import Attention, grouped_attention
from specbatch.decoding.kv_blocks import KVLayout, KVStore

# Speculative steps may write a few draft tokens past a row's last allowed position
# (they are discarded); the RoPE table covers them.
ROPE_MARGIN = 16


@dataclass(frozen=True)
class LayerWeights:
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


@dataclass(frozen=True)
class ModelWeights:
    """Every tensor a pass reads, as plain inputs: the step functions take them as
    arguments (not closed-over module state), so one compiled graph serves every model
    of the same shapes and CUDA graphs can pin their addresses."""

    embed: torch.Tensor
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    cos: torch.Tensor  # RoPE tables [positions, head_dim]
    sin: torch.Tensor
    layers: tuple[LayerWeights, ...]

    def tensors(self) -> list[torch.Tensor]:
        top = [self.embed, self.final_norm, self.lm_head, self.cos, self.sin]
        return top + [t for layer in self.layers for t in vars(layer).values()]


@dataclass(frozen=True)
class Geometry:
    """The shape facts a pass specialises on (Python ints: constants to a compiler)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32 (or wider) exactly as Qwen3RMSNorm does."""
    compute_dtype = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(compute_dtype)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hidden_states(
    weights: ModelWeights,
    geometry: Geometry,
    store: KVStore,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    write_slots: torch.Tensor,
    read_slots: torch.Tensor,
    attention: Attention = grouped_attention,
) -> torch.Tensor:
    """The last layer's hidden states [B, T, H] for ``tokens`` [B, T] fed at
    ``positions`` [B, T], writing their keys/values to ``write_slots`` [B, T] and reading
    ``read_slots`` [B, S]. Pure tensor code: no host synchronisation, shapes fixed by
    the inputs, so it traces into one graph."""
    batch, steps = tokens.shape
    heads, kv_heads, dim = geometry.num_heads, geometry.num_kv_heads, geometry.head_dim
    cos = weights.cos[positions].unsqueeze(1)
    sin = weights.sin[positions].unsqueeze(1)
    write = write_slots.reshape(-1)

    hidden = F.embedding(tokens, weights.embed)
    for index, w in enumerate(weights.layers):
        normed = _rms_norm(hidden, w.input_norm, geometry.eps)
        q = F.linear(normed, w.q_proj).view(batch, steps, heads, dim)
        k = F.linear(normed, w.k_proj).view(batch, steps, kv_heads, dim)
        v = F.linear(normed, w.v_proj).view(batch, steps, kv_heads, dim)
        q = _rms_norm(q, w.q_norm, geometry.eps).transpose(1, 2)
        k = _rms_norm(k, w.k_norm, geometry.eps).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        keys, values = store.keys[index], store.values[index]
        keys.index_copy_(0, write, k.transpose(1, 2).reshape(-1, kv_heads, dim))
        values.index_copy_(0, write, v.reshape(-1, kv_heads, dim))
        attn = attention(q, keys[read_slots].transpose(1, 2), values[read_slots].transpose(1, 2), positions)
        hidden = hidden + F.linear(attn.transpose(1, 2).reshape(batch, steps, -1), w.o_proj)
        normed = _rms_norm(hidden, w.post_norm, geometry.eps)
        hidden = hidden + F.linear(
            F.silu(F.linear(normed, w.gate_proj)) * F.linear(normed, w.up_proj), w.down_proj
        )
    return hidden


def project_logits(
    weights: ModelWeights, geometry: Geometry, hidden: torch.Tensor, index: torch.Tensor
) -> torch.Tensor:
    """Logits [B, M, V] of ``hidden`` [B, T, H] at the time indices ``index`` [B, M]."""
    picked = hidden.gather(1, index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    return F.linear(_rms_norm(picked, weights.final_norm, geometry.eps), weights.lm_head)


def head_dim_of(config: object) -> int:
    """Width of one attention head: Qwen3 configs name it (128 in the published ones,
    which is not hidden_size / heads for the 0.6B: 1024 / 16 = 64)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def cache_bytes_per_token(config: object, dtype: torch.dtype) -> int:
    """Bytes one cached token occupies in a model of ``config`` at ``dtype``: keys and
    values of every layer. A function of the configuration alone, so a KV pool can be
    sized for a model that is not loaded (the GPU estimate of the production shapes)."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim_of(config) * element


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
        self.head_dim: int = head_dim_of(config)
        self.eps: float = config.rms_norm_eps
        self.max_positions: int = config.max_position_embeddings
        body = hf_model.model
        self.embed = body.embed_tokens.weight
        self.dtype = self.embed.dtype
        self.device = self.embed.device
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
        self.weights = ModelWeights(
            embed=self.embed,
            final_norm=body.norm.weight,
            lm_head=hf_model.lm_head.weight,
            cos=emb.cos().to(self.dtype),
            sin=emb.sin().to(self.dtype),
            layers=tuple(
                LayerWeights(
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
            ),
        )
        self.geometry = Geometry(self.num_heads, self.num_kv_heads, self.head_dim, self.eps)
        self.tokens_fed = 0

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one cached token occupies: keys and values of every layer."""
        return cache_bytes_per_token(self.config, self.dtype)

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
        return project_logits(self.weights, self.geometry, hidden, logits_at)

    def _hidden(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        store: KVStore,
        layout: KVLayout,
        num_real: int | None,
    ) -> torch.Tensor:
        batch, steps = tokens.shape
        self.tokens_fed += batch * steps if num_real is None else num_real
        return hidden_states(
            self.weights, self.geometry, store, tokens, positions, layout.write_slots, layout.read_slots
        )
