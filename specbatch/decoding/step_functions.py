"""The engine's three step functions as pure tensor code: a prefill chunk, a sampling
step (the draft's proposal or a plain decode step) and the verify step over K+1.

Everything they read arrives as device tensors (tokens, positions, KV slots from the
block tables, sampling settings, seeds) and everything they decide stays there
(proposals, draft distributions, accepted counts). They contain no host
synchronisation (no ``.item()``, ``.tolist()``, ``bool(tensor)``, no control flow on
tensor values): the only branches are on Python facts fixed per call (which sampling
features the batch needs, the random stream's purpose), so each shape traces into one
graph that torch.compile fuses and a CUDA graph replays. The caller pads rows and
columns to fixed buckets; padded tokens write to the scratch block and padded rows
are greedy, so they cost compute but never change a real row's result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbatch.decoding import counter_random
from specbatch.decoding.attention import Attention
from specbatch.decoding.kv_blocks import KVStore
from specbatch.decoding.models import Geometry, ModelWeights, hidden_states, project_logits
from specbatch.decoding.sampling import SamplingFeatures, SamplingTensors, draw, gumbel_argmax, probabilities
from specbatch.decoding.speculative import DraftVerdict, verify, verify_coupled


@dataclass(frozen=True)
class Network:
    """One model as the step functions see it: weights, cache and how it attends."""

    weights: ModelWeights
    geometry: Geometry
    store: KVStore
    vocab: int  # the id range target and draft share; logits are cut to it
    attention: Attention

    def tensors(self) -> list[torch.Tensor]:
        return self.weights.tensors() + self.store.keys + self.store.values


@dataclass(frozen=True)
class Feed:
    """What one pass feeds and where: tokens and positions [B, T], the slot each fed
    token writes [B, T] (scratch for padding) and the slots of positions 0..S-1 [B, S]."""

    tokens: torch.Tensor
    positions: torch.Tensor
    write_slots: torch.Tensor
    read_slots: torch.Tensor


@dataclass(frozen=True)
class Draws:
    """Per-row sampling settings and random-stream keys [B]."""

    params: SamplingTensors
    seeds: torch.Tensor
    coupled: torch.Tensor


def _hidden(net: Network, feed: Feed) -> torch.Tensor:
    return hidden_states(
        net.weights,
        net.geometry,
        net.store,
        feed.tokens,
        feed.positions,
        feed.write_slots,
        feed.read_slots,
        net.attention,
    )


def prefill_chunk(net: Network, feed: Feed) -> None:
    """Cache the fed tokens' keys and values; no logits."""
    _hidden(net, feed)


def sample_step(
    net: Network,
    feed: Feed,
    logits_index: torch.Tensor,
    draws: Draws,
    draw_position: torch.Tensor,
    purpose: int,
    features: SamplingFeatures,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Feed, then draw one token per row from the logits at time index ``logits_index``
    [B, 1] for the token at ``draw_position`` [B]; returns (tokens [B], distributions
    [B, V])."""
    logits = project_logits(net.weights, net.geometry, _hidden(net, feed), logits_index)[..., : net.vocab]
    probs = probabilities(logits, draws.params, features)[:, 0]
    return draw(probs, draws.seeds, draws.coupled, draw_position, purpose, features), probs


def verify_step(
    net: Network,
    feed: Feed,
    draws: Draws,
    seq_len: torch.Tensor,
    drafts: torch.Tensor,
    draft_probs: torch.Tensor,
    lookahead: torch.Tensor,
    features: SamplingFeatures,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Feed the pending token and the drafts [B, K] (columns past ``lookahead`` [B] are
    padding), score all K+1 positions and verify; returns (accepted [B], next token [B])."""
    width = feed.tokens.shape[1]
    offsets = torch.arange(width, device=seq_len.device)
    index = offsets.expand(seq_len.shape[0], width)
    logits = project_logits(net.weights, net.geometry, _hidden(net, feed), index)[..., : net.vocab]
    target_probs = probabilities(logits, draws.params, features)
    token_positions = seq_len.unsqueeze(1) + offsets  # where each possible new token lands
    k = drafts.shape[1]
    verdict = verify(
        drafts,
        draft_probs,
        target_probs,
        counter_random.uniforms(draws.seeds, token_positions[:, :k], counter_random.ACCEPT),
        counter_random.uniforms(draws.seeds, token_positions, counter_random.NEXT),
        lookahead,
    )
    if features.coupled:
        noise = counter_random.gumbel_noise(draws.seeds, token_positions, target_probs.shape[-1])
        gumbel = verify_coupled(drafts, gumbel_argmax(target_probs, noise), lookahead)
        verdict = DraftVerdict(
            accepted=torch.where(draws.coupled, gumbel.accepted, verdict.accepted),
            next_token=torch.where(draws.coupled, gumbel.next_token, verdict.next_token),
        )
    return verdict.accepted, verdict.next_token
