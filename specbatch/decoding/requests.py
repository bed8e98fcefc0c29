"""What a caller asks of the engine per row, and what it gets back."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specbatch import acceptance


class UnrunnableRequestError(ValueError):
    """A request this engine cannot run (settings without meaning, a prompt out of range,
    more tokens than the context or the KV pool holds), with a message meant for the user.

    A ValueError, so a caller that guards against bad input catches it without knowing
    the engine."""


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str | Sequence[int]
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    stop: Sequence[str] = ()
    seed: int | None = None
    deadline: float | None = None  # time.monotonic() after which the row is dropped
    # run to max_new_tokens through end-of-sequence tokens (vLLM's ignore_eos): a load
    # test's fixed output lengths; the tokens are still the model's own
    ignore_eos: bool = False
    # neither end of sequence nor a stop string ends the row before this many tokens
    # (vLLM's min_tokens); at most max_new_tokens
    min_tokens: int = 0


@dataclass
class GenerationResult:
    tokens: list[int]
    text: str
    finish_reason: str  # "stop" | "length" | "cancelled" | "deadline" | "error"
    num_input_tokens: int
    num_output_tokens: int
    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0
    error: str = ""
    preemptions: int = 0

    @property
    def acceptance_rate(self) -> float:
        return acceptance.acceptance_rate(self.total_draft_tokens, self.total_accepted_draft_tokens)


def check_sampling_settings(request: GenerationRequest) -> None:
    """Reject settings that have no meaning, before any compute is spent."""
    if isinstance(request.max_new_tokens, bool) or not isinstance(request.max_new_tokens, int):
        raise UnrunnableRequestError(f"max_new_tokens must be an integer, got {request.max_new_tokens!r}")
    if request.max_new_tokens <= 0:
        raise UnrunnableRequestError(f"max_new_tokens must be positive, got {request.max_new_tokens}")
    temperature = float(request.temperature)
    if math.isnan(temperature) or temperature < 0:
        raise UnrunnableRequestError(f"temperature must be a number >= 0, got {request.temperature}")
    top_p = float(request.top_p)
    if math.isnan(top_p) or not 0 < top_p <= 1:
        raise UnrunnableRequestError(f"top_p must be in (0, 1], got {request.top_p}")
    if isinstance(request.top_k, bool) or not isinstance(request.top_k, int) or request.top_k < 0:
        raise UnrunnableRequestError(f"top_k must be an integer >= 0 (0 = off), got {request.top_k!r}")
    if isinstance(request.min_tokens, bool) or not isinstance(request.min_tokens, int):
        raise UnrunnableRequestError(f"min_tokens must be an integer, got {request.min_tokens!r}")
    if not 0 <= request.min_tokens <= request.max_new_tokens:
        raise UnrunnableRequestError(
            f"min_tokens must lie in [0, max_new_tokens={request.max_new_tokens}], got {request.min_tokens}"
        )
    if isinstance(request.stop, str):
        raise UnrunnableRequestError("stop must be a sequence of strings, not a single string")
    if any(not isinstance(s, str) or not s for s in request.stop):
        raise UnrunnableRequestError("stop strings must be non-empty strings")
