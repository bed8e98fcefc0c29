"""Random numbers keyed by (seed, position, purpose): the same row draws the same
numbers for the same token whatever batch it runs in, whichever K a step uses, and
after a preemption re-runs it.

A stateful generator per row would hand out numbers in call order, so a different
K (more or fewer draws per step) shifts every later draw. A counter-based stream
computes each number from its key with an integer hash instead (lowbias32, applied
in a chain over the key's parts), vectorised on the device.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF

# Purposes: separate streams for the draft's proposal, the acceptance test and the
# target's own draw (residual, bonus or plain decoding) at one position.
DRAFT = 1
ACCEPT = 2
NEXT = 3
GUMBEL = 4


def _mix(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 (Chris Wellons) on int64 tensors holding 32-bit values; products wrap
    modulo 2**64 and the mask keeps the exact low 32 bits."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def _hash(*parts: torch.Tensor) -> torch.Tensor:
    state = torch.zeros((), dtype=torch.long, device=parts[0].device)
    for part in parts:
        state = _mix(state ^ (part & _MASK32))
    return state


def as_int64(seed: int) -> int:
    """A seed of up to 64 bits as the int64 a device tensor holds: an unsigned seed past
    2**63 (TensorRT-LLM's `random_seed` is UINT64) wraps to its two's complement, which
    keeps all 64 bits for the hash. ValueError outside [-2**63, 2**64)."""
    if not -(1 << 63) <= seed < 1 << 64:
        raise ValueError(f"a seed must fit in 64 bits, got {seed}")
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def _to_unit(bits: torch.Tensor) -> torch.Tensor:
    """32 random bits to a float64 strictly inside (0, 1)."""
    return (bits.to(torch.float64) + 0.5) / 4294967296.0


def uniforms(seeds: torch.Tensor, positions: torch.Tensor, purpose: int) -> torch.Tensor:
    """[B, M] uniforms for ``seeds`` [B] (int64) at ``positions`` [B, M]."""
    seeds = seeds.unsqueeze(1)
    purpose_t = torch.full_like(positions, purpose)
    return _to_unit(_hash(seeds >> 32, seeds, positions, purpose_t))


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, M, V] standard Gumbel noise, one value per (seed, position, token id)."""
    seeds = seeds.view(-1, 1, 1)
    tokens = torch.arange(vocab, device=positions.device).view(1, 1, vocab)
    key = _hash(seeds >> 32, seeds, positions.unsqueeze(-1), torch.full_like(positions, GUMBEL).unsqueeze(-1))
    return -torch.log(-torch.log(_to_unit(_mix(key ^ tokens))))
