"""Log-probabilities of output tokens: what the engine reports and the JSON they travel in.

The engine reports token ids; the instance, which holds the tokenizer, adds each token's
text and writes the JSON that the scheduler passes on unread as the ``logprobs`` output
and the OpenAI front turns into OpenAI's objects. It lives outside ``specbatch.decoding``,
whose package imports torch, so the torch-free scheduler and front share the bound.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Most alternatives a prompt may ask to see per token (vLLM's default max_logprobs, and
# OpenAI's top_logprobs bound).
MAX_LOGPROBS = 20
# JSON has no -inf: a token the model gives no chance reads this (vLLM's floor too).
LOWEST_LOGPROB = -9999.0


@dataclass(frozen=True)
class TokenLogprob:
    """One output token's log-probability under the model that decoded its row (the
    target's, whatever drafted it), from its raw logits (before temperature and the
    filters, as vLLM reports them), and the ``top`` most likely tokens at that position,
    most likely first, as (token id, log-probability)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def to_json(logprobs: Sequence[TokenLogprob], token_text: Callable[[int], str]) -> str:
    """``[{"id", "token", "logprob", "top_logprobs": [{"id", "token", "logprob"}, ...]}, ...]``,
    one entry per output token in order; ``token`` is the token's own text."""

    def entry(token: int, logprob: float) -> dict:
        return {"id": token, "token": token_text(token), "logprob": max(logprob, LOWEST_LOGPROB)}

    return json.dumps(
        [
            {**entry(lp.token, lp.logprob), "top_logprobs": [entry(token, value) for token, value in lp.top]}
            for lp in logprobs
        ],
        separators=(",", ":"),
    )


def join_json(parts: Sequence[str]) -> str:
    """Lists written by :func:`to_json` as one list, without parsing them (the scheduler
    coalesces a prompt's stream deltas); "" when no part is a list (a row reporting none)."""
    lists = [part for part in parts if part]
    if not lists:
        return ""
    return "[" + ",".join(part[1:-1] for part in lists if part != "[]") + "]"
