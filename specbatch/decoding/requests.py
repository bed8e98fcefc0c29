"""What a caller asks of the engine per row, and what it gets back."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specbatch import acceptance
from specbatch.logprobs import MAX_LOGPROBS, TokenLogprob


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
    # nothing ends the row before this many tokens (vLLM's min_tokens): its end tokens are
    # banned from sampling until then and a stop string counts only past them; at most
    # max_new_tokens
    min_tokens: int = 0
    # vLLM's penalties (presence and frequency on the output, repetition on prompt and
    # output): 0, 0 and 1 leave the logits alone
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # report each output token's log-probability and this many most likely alternatives
    # (vLLM's logprobs; None: report none), up to MAX_LOGPROBS
    logprobs: int | None = None
    # drop the tokens less likely than min_p times the likeliest (vLLM's min_p; 0: off)
    min_p: float = 0.0
    # (token id, value) pairs added to those tokens' logits before sampling (OpenAI's
    # logit_bias), draft and target alike
    logit_bias: Sequence[tuple[int, float]] = ()
    # token ids that end the row as its end-of-sequence token does (vLLM's stop_token_ids),
    # whether or not it ignores end of sequence
    stop_token_ids: Sequence[int] = ()
    # the text keeps the stop string that ended the row (vLLM's include_stop_str_in_output)
    include_stop_str_in_output: bool = False

    @property
    def penalties(self) -> tuple[float, float, float]:
        """(presence, frequency, repetition), as a step gathers them."""
        return (float(self.presence_penalty), float(self.frequency_penalty), float(self.repetition_penalty))


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
    logprobs: list[TokenLogprob] | None = None  # one per token, when the request asked

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
    min_p = float(request.min_p)
    if math.isnan(min_p) or not 0 <= min_p <= 1:
        raise UnrunnableRequestError(f"min_p must be in [0, 1], got {request.min_p}")
    if isinstance(request.top_k, bool) or not isinstance(request.top_k, int) or request.top_k < 0:
        raise UnrunnableRequestError(f"top_k must be an integer >= 0 (0 = off), got {request.top_k!r}")
    if isinstance(request.min_tokens, bool) or not isinstance(request.min_tokens, int):
        raise UnrunnableRequestError(f"min_tokens must be an integer, got {request.min_tokens!r}")
    if not 0 <= request.min_tokens <= request.max_new_tokens:
        raise UnrunnableRequestError(
            f"min_tokens must lie in [0, max_new_tokens={request.max_new_tokens}], got {request.min_tokens}"
        )
    presence, frequency, repetition = request.penalties
    if not (math.isfinite(presence) and math.isfinite(frequency)):
        raise UnrunnableRequestError(
            f"presence_penalty and frequency_penalty must be finite, got {presence} and {frequency}"
        )
    if not (math.isfinite(repetition) and repetition > 0):
        raise UnrunnableRequestError(f"repetition_penalty must be a number > 0, got {repetition}")
    if request.logprobs is not None and (
        isinstance(request.logprobs, bool)
        or not isinstance(request.logprobs, int)
        or not 0 <= request.logprobs <= MAX_LOGPROBS
    ):
        raise UnrunnableRequestError(
            f"logprobs must be an integer in [0, {MAX_LOGPROBS}] (or None), got {request.logprobs!r}"
        )
    if isinstance(request.stop, str):
        raise UnrunnableRequestError("stop must be a sequence of strings, not a single string")
    if any(not isinstance(s, str) or not s for s in request.stop):
        raise UnrunnableRequestError("stop strings must be non-empty strings")
    if any(
        isinstance(token, bool) or not isinstance(token, int) or not math.isfinite(float(value))
        for token, value in request.logit_bias
    ):
        raise UnrunnableRequestError(
            f"logit_bias must pair token ids with finite numbers, got {request.logit_bias!r}"
        )
    if any(isinstance(t, bool) or not isinstance(t, int) for t in request.stop_token_ids):
        raise UnrunnableRequestError(f"stop_token_ids must be integers, got {list(request.stop_token_ids)!r}")
