"""Per-prompt request parameters: parsing, defaults and validation.

Sampling inputs may be sent once for the whole request (shape [1], the TensorRT-LLM
convention) or once per prompt (shape [N]); either way every prompt ends up with its
own `SamplingParams`, and a bad value fails only the prompts it applies to.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specbatch.logprobs import MAX_LOGPROBS
from specbatch.routing import TASKS


class PromptError(ValueError):
    """A problem with one prompt: reported for that prompt alone."""


class RequestError(ValueError):
    """A problem with the request as a whole: answered with a TritonError."""


@dataclass(frozen=True)
class SamplingParams:
    """Decoding parameters of one prompt after defaults were applied."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stream: bool = False
    stop: tuple[str, ...] = ()
    # a sampled row with a seed draws the same tokens in any batch; None: a fresh draw
    random_seed: int | None = None
    # run to max_tokens through end-of-sequence (vLLM's ignore_eos): fixed output lengths
    ignore_eos: bool = False
    # nothing ends it sooner: its end tokens are banned until then (vLLM's min_tokens)
    min_tokens: int = 0
    # report each output token's log-probability and this many alternatives (vLLM's
    # logprobs; None: none)
    logprobs: int | None = None
    # drop the tokens less likely than this share of the likeliest (vLLM's min_p; 0: off)
    min_p: float = 0.0
    # token ids that end the prompt as its end-of-sequence token does (vLLM's stop_token_ids)
    stop_token_ids: tuple[int, ...] = ()
    # (token id, value) added to those tokens' logits (OpenAI's logit_bias)
    logit_bias: tuple[tuple[int, float], ...] = ()
    # vLLM's and TensorRT-LLM's penalties: presence and frequency on the output, repetition
    # on prompt and output (0, 0 and 1: none)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # the text keeps the stop string that ended it (vLLM's include_stop_str_in_output)
    include_stop_str_in_output: bool = False


MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 16
# OpenAI's bounds on logit_bias: entries per request, and each value's magnitude
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_LOGIT_BIAS = 100.0
# OpenAI's range for the presence and frequency penalties
MAX_PENALTY = 2.0


def decode_stop_words(raw: Sequence[bytes | str] | None) -> tuple[str, ...]:
    """The request's stop strings (the TensorRT-LLM `stop_words` input); empty entries are ignored."""
    if raw is None:
        return ()
    decoded = []
    for index, value in enumerate(raw):
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RequestError(f"stop_words[{index}] is not valid UTF-8 (byte {exc.start})") from None
        decoded.append(str(value))
    words = tuple(w for w in decoded if w)
    if len(words) > MAX_STOP_STRINGS or any(len(w) > MAX_STOP_CHARS for w in words):
        raise RequestError(
            f"stop_words: at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_CHARS} characters"
        )
    return words


def decode_stop_token_ids(raw: Sequence[int] | None) -> tuple[int, ...]:
    """The request's stop token ids (vLLM's `stop_token_ids`), in the order sent; whether
    each is in the model's vocabulary is the instance's check, which knows it."""
    ids = tuple(int(value) for value in raw or ())
    if len(ids) > MAX_STOP_TOKEN_IDS or any(value < 0 for value in ids):
        raise RequestError(f"stop_token_ids: at most {MAX_STOP_TOKEN_IDS} token ids, each >= 0")
    return ids


def decode_logit_bias(
    ids: Sequence[int] | None, values: Sequence[float] | None
) -> tuple[tuple[int, float], ...]:
    """The request's logit bias from its two inputs, `logit_bias_ids` and
    `logit_bias_values` (one value per id), in the order sent; whether each id is in the
    model's vocabulary is the instance's check."""
    ids, values = list(ids or ()), list(values or ())
    if len(ids) != len(values):
        raise RequestError(f"logit_bias_ids holds {len(ids)} ids and logit_bias_values {len(values)} values")
    pairs = tuple((int(token), float(value)) for token, value in zip(ids, values, strict=True))
    if len(pairs) > MAX_LOGIT_BIAS_ENTRIES or any(token < 0 for token, _ in pairs):
        raise RequestError(f"logit_bias: at most {MAX_LOGIT_BIAS_ENTRIES} token ids, each >= 0")
    if any(not (math.isfinite(value) and abs(value) <= MAX_LOGIT_BIAS) for _, value in pairs):
        raise RequestError(f"logit_bias values must lie in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]")
    return pairs


@dataclass(frozen=True)
class ServingLimits:
    """Server-side bounds and defaults for request parameters."""

    max_tokens_cap: int = 1024
    default_max_tokens: int = 256
    default_temperature: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.default_max_tokens <= self.max_tokens_cap:
            raise ValueError(
                f"default_max_tokens={self.default_max_tokens} must lie in "
                f"[1, max_tokens_cap={self.max_tokens_cap}]"
            )


def broadcast(values: Sequence | None, count: int, name: str) -> list | None:
    """Expand a [1] input to `count` prompts; keep a [count] input; refuse other lengths."""
    if values is None:
        return None
    values = list(values)
    if len(values) == 1:
        return values * count
    if len(values) == count:
        return values
    raise RequestError(
        f"'{name}' has {len(values)} values for {count} prompts: send 1 value or one per prompt"
    )


def decode_prompt(raw: bytes | str) -> str:
    """The prompt as text; non-UTF-8 bytes and blank prompts are refused."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PromptError(
                f"prompt is not valid UTF-8 (byte {exc.start}: {raw[exc.start : exc.start + 1]!r})"
            ) from None
    else:
        text = raw
    if not text.strip():
        raise PromptError("prompt is empty")
    return text


def decode_task_override(raw: bytes | str | None) -> str | None:
    """An explicit task name, or None for 'let the router decide' (an empty string)."""
    if raw is None:
        return None
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    text = text.strip().lower()
    if not text:
        return None
    if text not in TASKS:
        raise PromptError(f"unknown task override {text!r}: expected one of {', '.join(TASKS)}")
    return text


def sampling_params(
    limits: ServingLimits,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    stream: bool = False,
    stop: tuple[str, ...] = (),
    stop_token_ids: tuple[int, ...] = (),
    logit_bias: tuple[tuple[int, float], ...] = (),
    random_seed: int | None = None,
    ignore_eos: bool | None = None,
    min_tokens: int | None = None,
    logprobs: int | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    repetition_penalty: float | None = None,
    min_p: float | None = None,
    include_stop_str_in_output: bool | None = None,
) -> SamplingParams:
    """Validate one prompt's parameters against the server's limits and fill defaults."""
    tokens = limits.default_max_tokens if max_tokens is None else int(max_tokens)
    if tokens <= 0:
        raise PromptError(f"max_tokens must be positive, got {tokens}")
    if tokens > limits.max_tokens_cap:
        raise PromptError(f"max_tokens={tokens} exceeds this server's cap of {limits.max_tokens_cap}")
    temp = limits.default_temperature if temperature is None else float(temperature)
    if not math.isfinite(temp) or temp < 0:
        raise PromptError(f"temperature must be a finite number >= 0, got {temp}")
    p = 1.0 if top_p is None else float(top_p)
    if math.isnan(p) or not 0 < p <= 1:
        raise PromptError(f"top_p must lie in (0, 1], got {p}")
    k = 0 if top_k is None else int(top_k)
    if k < 0:
        raise PromptError(f"top_k must be >= 0 (0 disables it), got {k}")
    seed = None if random_seed is None else int(random_seed)
    if seed is not None and not 0 <= seed < 1 << 64:
        raise PromptError(f"random_seed must lie in [0, 2**64), got {seed}")
    least = 0 if min_tokens is None else int(min_tokens)
    if not 0 <= least <= tokens:
        raise PromptError(f"min_tokens must lie in [0, max_tokens={tokens}], got {least}")
    alternatives = None if logprobs is None or int(logprobs) < 0 else int(logprobs)
    if alternatives is not None and alternatives > MAX_LOGPROBS:
        raise PromptError(f"logprobs must lie in [0, {MAX_LOGPROBS}] (negative: none), got {alternatives}")
    share = 0.0 if min_p is None else float(min_p)
    if math.isnan(share) or not 0 <= share <= 1:
        raise PromptError(f"min_p must lie in [0, 1] (0 is off), got {share}")
    presence = _penalty("presence_penalty", presence_penalty)
    frequency = _penalty("frequency_penalty", frequency_penalty)
    repetition = 1.0 if repetition_penalty is None else float(repetition_penalty)
    if not (math.isfinite(repetition) and repetition > 0):
        raise PromptError(f"repetition_penalty must be a number > 0 (1 is none), got {repetition}")
    return SamplingParams(
        max_tokens=tokens,
        temperature=temp,
        top_p=p,
        top_k=k,
        stream=bool(stream),
        stop=tuple(stop),
        stop_token_ids=tuple(stop_token_ids),
        logit_bias=tuple(logit_bias),
        random_seed=seed,
        ignore_eos=bool(ignore_eos),
        min_tokens=least,
        logprobs=alternatives,
        presence_penalty=presence,
        frequency_penalty=frequency,
        repetition_penalty=repetition,
        min_p=share,
        include_stop_str_in_output=bool(include_stop_str_in_output),
    )


def _penalty(name: str, value: float | None) -> float:
    penalty = 0.0 if value is None else float(value)
    if not (math.isfinite(penalty) and -MAX_PENALTY <= penalty <= MAX_PENALTY):
        bound = f"{MAX_PENALTY:g}"
        raise PromptError(f"{name} must lie in [-{bound}, {bound}] (0 is none), got {penalty}")
    return penalty
