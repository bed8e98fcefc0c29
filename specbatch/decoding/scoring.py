"""Multiple-choice scoring: which label does the target find most likely after a prompt?

One prefill per batch and no decoding; a label scores the sum of its tokens'
log-probabilities after the prompt. When a prompt's labels differ only in their last
token (" A", " B", ... are one token each in most tokenizers, or a shared lead such
as a space followed by the letter in others), the prompt and that shared lead are fed
once as one row and every label is read off its last positions: the same logits the
label's own row would compute, at the cost of one prompt instead of one per label.
Otherwise every (prompt, label) pair is one row of the same forward pass.
The prompt must already end with the answer cue (e.g. ``Answer:``); labels are
scored exactly as given, so pass the form that follows the cue (``" A"`` or ``"A"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from specbatch.decoding.kv_blocks import dense_pool, layout_for
from specbatch.decoding.requests import UnrunnableRequestError

if TYPE_CHECKING:
    from specbatch.decoding.pair import ModelPair


@dataclass
class ChoiceScores:
    """A scored prompt: the most likely label, every label's log-likelihood, and the
    prompt tokens the target read to score them (what a served answer reports as its
    input tokens: a scoring generates nothing, but it prefills its whole prompt)."""

    best: str
    logprobs: dict[str, float]
    input_tokens: int


def _encode(pair: ModelPair, text: str) -> list[int]:
    return pair.tokenizer.encode(text, add_special_tokens=False)


def check_scoring_row(
    pair: ModelPair, prompt: str, labels: Sequence[str], index: int = 0
) -> tuple[list[int], list[list[int]]]:
    """The row's prompt and label token ids; UnrunnableRequestError if it cannot be scored."""
    ids = _encode(pair, prompt)
    row_ids = [_encode(pair, label) for label in labels]
    if not ids:
        raise UnrunnableRequestError(f"prompt {index} is empty")
    if not labels:
        raise UnrunnableRequestError(f"prompt {index} has no labels to score")
    if any(not t for t in row_ids):
        raise UnrunnableRequestError(f"prompt {index} has an empty label")
    if len(set(labels)) != len(labels):
        raise UnrunnableRequestError(f"prompt {index} has duplicate labels")
    longest = len(ids) + max(len(t) for t in row_ids)
    if longest > pair.max_context:
        raise UnrunnableRequestError(f"prompt {index} ({longest} tokens with its label) exceeds the context")
    return ids, row_ids


def score_choices(
    pair: ModelPair, prompts: Sequence[str], labels: Sequence[Sequence[str]]
) -> list[ChoiceScores]:
    if len(prompts) != len(labels):
        raise UnrunnableRequestError(f"{len(prompts)} prompts but {len(labels)} label lists")
    if not prompts:
        return []
    checked = [
        check_scoring_row(pair, p, row, index)
        for index, (p, row) in enumerate(zip(prompts, labels, strict=True))
    ]
    prompt_ids = [ids for ids, _ in checked]
    label_ids = [row_ids for _, row_ids in checked]
    rows, reads, owners = [], [], []  # owners: (prompt index, label, row, label's token ids)
    for index, (ids, row_ids) in enumerate(zip(prompt_ids, label_ids, strict=True)):
        lead = _shared_lead(row_ids)
        if lead is not None:  # one row: the prompt and the lead, each label at its last token
            rows.append(ids + lead)
            reads.append(list(range(len(ids) - 1, len(ids) + len(lead))))
            owners.extend(
                (index, label, len(rows) - 1, t) for label, t in zip(labels[index], row_ids, strict=True)
            )
            continue
        for label, t in zip(labels[index], row_ids, strict=True):
            rows.append(ids + t)
            reads.append(list(range(len(ids) - 1, len(ids) - 1 + len(t))))
            owners.append((index, label, len(rows) - 1, t))
    logprob_rows = _forward_logprobs(pair, rows, reads)
    scores: list[dict[str, float]] = [{} for _ in prompts]
    for index, label, row, t in owners:
        read = logprob_rows[row][: len(t)]
        scores[index][label] = float(read.gather(-1, torch.tensor(t).unsqueeze(-1)).sum())
    return [
        ChoiceScores(best=max(s, key=lambda label: s[label]), logprobs=s, input_tokens=len(ids))
        for s, ids in zip(scores, prompt_ids, strict=True)
    ]


def _shared_lead(row_ids: list[list[int]]) -> list[int] | None:
    """The tokens every label starts with when each label is that lead and one more
    token (distinct labels, so distinct last tokens); None otherwise."""
    lead = row_ids[0][:-1]
    if all(len(t) == len(lead) + 1 and t[:-1] == lead for t in row_ids):
        return lead
    return None


def _forward_logprobs(pair: ModelPair, rows: list[list[int]], reads: list[list[int]]) -> list[torch.Tensor]:
    """One batched forward; per row, log-softmax at the positions in ``reads`` (on CPU)."""
    device = pair.device
    width = max(len(r) for r in rows)
    tokens = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long, device=device)
    positions = torch.arange(width, device=device).expand(len(rows), width)
    read_width = max(len(r) for r in reads)
    logits_at = torch.tensor(
        [r + [r[-1]] * (read_width - len(r)) for r in reads], dtype=torch.long, device=device
    )
    pool, tables = dense_pool(len(rows), width)
    store = pair.target.new_store(pool.num_slots)
    real = positions < torch.tensor([len(r) for r in rows], device=device).unsqueeze(1)
    logits = pair.target(tokens, positions, store, layout_for(tables, positions, real, pool), logits_at)
    logprobs = torch.log_softmax(logits[..., : pair.vocab_size].float(), dim=-1).cpu()
    return [lp[: len(r)] for lp, r in zip(logprobs, reads, strict=True)]
