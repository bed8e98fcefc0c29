"""Vectorised verification of K drafted tokens per row (Leviathan et al.; Chen et al.).

Draft token i is accepted with probability min(1, p(d_i) / q(d_i)); a row keeps
its leading run of accepted tokens, then draws one more token: from the residual
max(0, p - q) renormalised at the first rejection, or from p itself (the bonus
token) when all K were accepted. Every row is handled at once: one comparison over
[B, K], the accepted count from a cumulative product, no per-token Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbatch.decoding.sampling import sample


@dataclass
class DraftVerdict:
    """What verification decided per row: how many drafted tokens stay, and the token after them."""

    accepted: torch.Tensor  # [B] number of leading draft tokens kept, 0..K
    next_token: torch.Tensor  # [B] correction (residual) or bonus token


def verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    accept_uniforms: torch.Tensor,
    next_uniforms: torch.Tensor,
    lookahead: torch.Tensor | None = None,
) -> DraftVerdict:
    """``draft_tokens`` [B, K] were sampled from ``draft_probs`` [B, K, V];
    ``target_probs`` [B, K+1, V] are the target's distributions after the pending token
    and after each draft token. Uniforms: [B, K] for the acceptance tests and [B, K+1]
    for the last draw, one per position it may land on (keyed by position, so a row
    draws the same number for the same token whatever K is).

    ``lookahead`` [B] (default: all K columns) is the real K of a padded batch: columns
    past it are never accepted and the bonus token comes after column lookahead - 1."""
    batch, width = draft_tokens.shape
    lookahead = _real_lookahead(lookahead, batch, width, draft_tokens.device)
    index = draft_tokens.unsqueeze(-1)
    p_at = target_probs[:, :width].gather(-1, index).squeeze(-1).to(torch.float64)
    q_at = draft_probs.gather(-1, index).squeeze(-1).to(torch.float64)
    accept = (accept_uniforms.to(torch.float64) * q_at < p_at) & _real_columns(lookahead, width)
    accepted = accept.to(torch.long).cumprod(dim=1).sum(dim=1)

    rows = torch.arange(batch, device=draft_tokens.device)
    p_next = target_probs[rows, accepted]
    q_next = draft_probs[rows, torch.minimum(accepted, lookahead - 1)]
    residual = (p_next - q_next).clamp_min(0)
    all_accepted = (accepted == lookahead).unsqueeze(-1)
    # p == q leaves no residual mass; a rejection then had probability zero, so p is right.
    degenerate = residual.sum(-1, keepdim=True) <= 0
    distribution = torch.where(all_accepted | degenerate, p_next, residual)
    chosen_uniform = next_uniforms.gather(1, accepted.unsqueeze(1)).squeeze(1)
    return DraftVerdict(accepted=accepted, next_token=sample(distribution, chosen_uniform))


def verify_coupled(
    draft_tokens: torch.Tensor, target_choice: torch.Tensor, lookahead: torch.Tensor | None = None
) -> DraftVerdict:
    """Gumbel-coupled verification: ``target_choice`` [B, K+1] is the target's own
    Gumbel-max draw at each position; a draft token is kept while it equals that draw,
    and the draw at the first mismatch (or after K matches) comes next. ``lookahead``
    as in :func:`verify`."""
    batch, width = draft_tokens.shape
    lookahead = _real_lookahead(lookahead, batch, width, draft_tokens.device)
    matches = ((draft_tokens == target_choice[:, :width]) & _real_columns(lookahead, width)).to(torch.long)
    accepted = matches.cumprod(dim=1).sum(dim=1)
    next_token = target_choice.gather(1, accepted.unsqueeze(1)).squeeze(1)
    return DraftVerdict(accepted=accepted, next_token=next_token)


def _real_lookahead(
    lookahead: torch.Tensor | None, batch: int, width: int, device: torch.device
) -> torch.Tensor:
    if lookahead is None:
        return torch.full((batch,), width, dtype=torch.long, device=device)
    return lookahead


def _real_columns(lookahead: torch.Tensor, width: int) -> torch.Tensor:
    """[B, K] True for the draft columns a row really proposed."""
    return torch.arange(width, device=lookahead.device) < lookahead.unsqueeze(1)
