"""Per-prompt request parameters: parsing, defaults and validation.

Sampling inputs may be sent once for the whole request (shape [1], the TensorRT-LLM
convention) or once per prompt (shape [N]); either way every prompt ends up with its
own `SamplingParams`, and a bad value fails only the prompts it applies to.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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
    # neither end of sequence nor a stop string ends it sooner (vLLM's min_tokens)
    min_tokens: int = 0


MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


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
    random_seed: int | None = None,
    ignore_eos: bool | None = None,
    min_tokens: int | None = None,
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
    return SamplingParams(
        max_tokens=tokens,
        temperature=temp,
        top_p=p,
        top_k=k,
        stream=bool(stream),
        stop=tuple(stop),
        random_seed=seed,
        ignore_eos=bool(ignore_eos),
        min_tokens=least,
    )
