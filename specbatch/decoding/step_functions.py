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
from specbatch.decoding.sampling import (
    EndMask,
    LogitBias,
    PenaltyTensors,
    SamplingFeatures,
    SamplingTensors,
    biased,
    counts_before,
    draw,
    ends_masked,
    gumbel_argmax,
    penalized,
    probabilities,
    token_logprobs,
)
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
    """Per-row sampling settings and random-stream keys [B], the penalties' inputs when
    some row has a penalty and the logit biases when some row has one."""

    params: SamplingTensors
    seeds: torch.Tensor
    coupled: torch.Tensor
    penalties: PenaltyTensors | None = None
    logit_bias: LogitBias | None = None
    end_mask: EndMask | None = None


def _adjusted(
    logits: torch.Tensor, draws: Draws, features: SamplingFeatures, counts, positions: torch.Tensor
) -> torch.Tensor:
    """The logits a row samples from: its logit bias added, then its penalties (which
    read ``counts()``, the occurrences each position adds to the output so far), then
    its end tokens banned where the token would land (``positions`` [B, M]) before its
    min_tokens are made."""
    if features.logit_bias:
        logits = biased(logits, draws.logit_bias)
    if features.penalties:
        logits = penalized(logits, draws.penalties, counts(), features.repetition)
    if features.end_mask:
        logits = ends_masked(logits, draws.end_mask, positions)
    return logits


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
    [B, 1] (biased and penalized where a row asks) for the token at ``draw_position`` [B];
    returns (tokens [B], distributions [B, V]), and where ``features.logprobs`` asks, the
    tokens' log-probabilities [B] and the top alternatives' values and ids [B, A]."""
    logits = project_logits(net.weights, net.geometry, _hidden(net, feed), logits_index)[..., : net.vocab]

    def counts() -> torch.Tensor:
        earlier = draws.penalties.step_tokens
        return counts_before(earlier, earlier.shape[1], 1, net.vocab)

    adjusted = _adjusted(logits, draws, features, counts, draw_position.unsqueeze(1))
    probs = probabilities(adjusted, draws.params, features)[:, 0]
    tokens = draw(probs, draws.seeds, draws.coupled, draw_position, purpose, features)
    if features.logprobs is None:
        return tokens, probs
    chosen, top_values, top_ids = token_logprobs(logits, tokens.unsqueeze(1), features.logprobs)
    return tokens, probs, chosen[:, 0], top_values[:, 0], top_ids[:, 0]


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
    padding), score all K+1 positions (biased and penalized where a row asks, each position
    counting the drafts before it as output) and verify; returns (accepted [B], next token [B]),
    and where ``features.logprobs`` asks, per column the log-probability [B, K+1] of the
    token a row commits there (its draft token before ``accepted``, the next token at
    it) and the top alternatives' values and ids [B, K+1, A]."""
    width = feed.tokens.shape[1]
    offsets = torch.arange(width, device=seq_len.device)
    index = offsets.expand(seq_len.shape[0], width)
    logits = project_logits(net.weights, net.geometry, _hidden(net, feed), index)[..., : net.vocab]
    token_positions = seq_len.unsqueeze(1) + offsets  # where each possible new token lands
    # position j follows the first j drafts
    scored = _adjusted(
        logits, draws, features, lambda: counts_before(drafts, 0, width, net.vocab), token_positions
    )
    target_probs = probabilities(scored, draws.params, features)
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
    if features.logprobs is None:
        return verdict.accepted, verdict.next_token
    committed = torch.cat([drafts, drafts.new_zeros(drafts.shape[0], width - k)], dim=1)
    committed = committed.scatter(1, verdict.accepted.unsqueeze(1), verdict.next_token.unsqueeze(1))
    chosen, top_values, top_ids = token_logprobs(logits, committed, features.logprobs)
    return verdict.accepted, verdict.next_token, chosen, top_values, top_ids
