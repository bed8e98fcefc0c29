"""OpenAI request bodies, validated into one `Call` the pipeline understands.

Honoured, each as the ensemble's input of that name unless said: `max_tokens`,
`temperature`, `top_p`, `stop`, `seed` (the pipeline's `random_seed`: a sampled prompt
with a seed gives the same tokens in any batch; greedy decoding does so without one),
`presence_penalty`, `frequency_penalty`, `logit_bias` (`logit_bias_ids` and
`logit_bias_values`), log-probabilities (the pipeline's `logprobs`: the target's raw
log-probability of each generated token and up to 20 alternatives; a completion's
`logprobs` counts the alternatives, 0 for the chosen token's alone, a chat asks with
`logprobs: true` and `top_logprobs`), and vLLM's extensions `top_k` (-1 or 0: off),
`min_p`, `min_tokens` (nothing ends an answer before that many tokens: its end tokens
are banned from sampling until then, and a stop string counts only past them),
`ignore_eos` (the answer runs to `max_tokens`: the fixed output lengths load testers ask
for, e.g. AIPerf's `--extra-inputs ignore_eos:true`),
`stop_token_ids` (any of them ends an answer as end of sequence does; its text stays
unless it is a special token, as in vLLM), `include_stop_str_in_output` (the text ends
with the stop string that ended it) and `repetition_penalty`.

`n` choices per prompt run as that many copies of the prompt, the choices prompt by
prompt (choice `i * n + j` is copy `j` of prompt `i`, as OpenAI numbers them). Each copy
samples on its own seed: unseeded, each row draws one; with `seed`, copy 0 keeps it (its
answer is the one `n` = 1 gives) and copy `j` takes a seed mixed from it and `j`, so the
copies differ and the whole reply is reproducible. Greedy copies are all the same
answer, as in vLLM. A completion's `best_of` runs that many copies and keeps the `n`
likeliest; its `echo` puts the prompt before the answer.

What the pipeline cannot honour is refused with a 400 naming the parameter, never
silently ignored: tools, `suffix`, token-id prompts, structured output
(`response_format` other than text, vLLM's guided decoding), beam search, a chat's
`echo` or `best_of`, and `echo` with `logprobs`
(the prompt's own log-probabilities are not computed). Each is accepted at
the value that means "not used", as clients send their defaults.

A chat request becomes its last user message (which the router classifies) plus the
earlier turns, which the model instance renders with Qwen3's chat template. The body
field `self_refine` (true or false; the openai client sends it in `extra_body`) is the
ensemble's input of that name.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from specbatch.logprobs import MAX_LOGPROBS
from specbatch.openai.errors import bad_request
from specbatch.serving.params import (
    MAX_LOGIT_BIAS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_PENALTY,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
)

MAX_PROMPTS = 64
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# Parameters the pipeline has no equivalent for, with the value that means "not used".
_UNSUPPORTED = {
    "suffix": (None, ""),
    "tools": (None, []),
    "functions": (None, []),
    "response_format": (None, {"type": "text"}),
    "tool_choice": (None, "none", "auto"),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "use_beam_search": (None, False),
}


@dataclass(frozen=True)
class Call:
    """One OpenAI request as pipeline inputs: prompts in order plus per-request options."""

    kind: Literal["completion", "chat"]
    model: str
    prompts: tuple[str, ...]
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # alternatives per token to report (None: no log-probabilities)
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    best_of: int | None = None  # copies run per prompt, the n likeliest kept (None: n)
    echo: bool = False  # a completion's text starts with its prompt
    chat_history: str = ""
    enable_thinking: bool = False
    self_refine: bool = False

    @property
    def copies(self) -> int:
        """How many times the pipeline runs each prompt: ``best_of``, or ``n``."""
        return self.best_of or self.n

    @property
    def pipeline_logprobs(self) -> int | None:
        """The log-probabilities asked of the pipeline: the client's, or the chosen
        tokens' alone where ``best_of`` ranks copies by them."""
        return 0 if self.logprobs is None and self.best_of else self.logprobs

    def prompt_of_choice(self, index: int) -> str:
        """The prompt that choice ``index`` answers (choices ``i * n + j``)."""
        return self.prompts[(index // self.n) * self.copies]


def parse_completion(body: Any) -> Call:
    """A `/v1/completions` body; `prompt` is one string or a list of strings (choices in order)."""
    body = _object(body)
    prompt = body.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts:
        raise bad_request("prompt must be a string or a non-empty list of strings", "prompt")
    if not all(isinstance(p, str) for p in prompts):
        raise bad_request("prompt must be text: token-id prompts are not supported", "prompt")
    common = _common(body, body.get("max_tokens"))
    logprobs = _completion_logprobs(body.get("logprobs"), body.get("top_logprobs"))
    echo = body.get("echo") or False
    if not isinstance(echo, bool):
        raise bad_request("echo must be true or false", "echo")
    if echo and logprobs is not None:
        raise bad_request(
            "echo with logprobs needs the prompt's log-probabilities, which are not computed", "echo"
        )
    best_of = _best_of(body.get("best_of"), common["n"], common["stream"])
    return Call(
        kind="completion",
        prompts=_copies(prompts, best_of or common["n"]),
        logprobs=logprobs,
        best_of=best_of,
        echo=echo,
        **common,
    )


def parse_chat(body: Any) -> Call:
    """A `/v1/chat/completions` body: the last message is the user's, earlier ones are history."""
    body = _object(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list", "messages")
    turns = [_message(i, m) for i, m in enumerate(messages)]
    if turns[-1]["role"] != "user":
        raise bad_request("the last message must be the user's", "messages")
    if any(t["role"] == "system" for t in turns[1:]):
        raise bad_request("a system message may only come first", "messages")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise bad_request("chat_template_kwargs must be an object", "chat_template_kwargs")
    thinking = kwargs.get("enable_thinking", body.get("enable_thinking", False))
    if not isinstance(thinking, bool):
        raise bad_request("enable_thinking must be true or false", "enable_thinking")
    for name, unused in (("echo", (None, False)), ("best_of", (None, 1))):
        if body.get(name) not in unused:
            raise bad_request(f"{name} is not supported for chat completions", name)
    common = _common(body, body.get("max_completion_tokens", body.get("max_tokens")))
    return Call(
        kind="chat",
        prompts=_copies([turns[-1]["content"]], common["n"]),
        chat_history=json.dumps(turns[:-1]) if len(turns) > 1 else "",
        enable_thinking=thinking,
        logprobs=_chat_logprobs(body.get("logprobs"), body.get("top_logprobs")),
        **common,
    )


def _copies(prompts: list[str], copies: int) -> tuple[str, ...]:
    """Each prompt ``copies`` times (``n``, or ``best_of``), prompt by prompt: the
    pipeline's prompts, one per copy."""
    if len(prompts) * copies > MAX_PROMPTS:
        param = "n" if copies > 1 else "prompt"
        raise bad_request(f"at most {MAX_PROMPTS} copies per request (prompts times n or best_of)", param)
    return tuple(prompt for prompt in prompts for _ in range(copies))


def _best_of(value: Any, n: int, stream: bool) -> int | None:
    """`best_of` copies per prompt, of which the ``n`` likeliest are returned; at least
    ``n``, and not streamed (which copies win is known only at the end), as OpenAI rules."""
    best_of = _positive_integer(value, "best_of")
    if best_of is None or best_of == n:
        return None
    if best_of < n:
        raise bad_request(f"best_of={best_of} must be at least n={n}", "best_of")
    if stream:
        raise bad_request("best_of cannot be streamed: which copies win is known only at the end", "best_of")
    return best_of


def copy_seed(seed: int, copy: int) -> int:
    """The seed copy ``copy`` of a prompt samples with under ``seed``: ``seed`` itself for
    copy 0; for the others a 64-bit mix of both (splitmix64's finaliser), so that copies
    do not share their draws with each other or, as ``seed + copy`` would, with another
    request sent the next seed."""
    if copy == 0:
        return seed
    mask = (1 << 64) - 1
    z = (seed + copy * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _message(position: int, message: Any) -> dict[str, str]:
    param = f"messages[{position}]"
    if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
        raise bad_request(f"{param} needs a role: one of {', '.join(CHAT_ROLES)}", param)
    content = message.get("content")
    if isinstance(content, list):
        if not all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        ):
            raise bad_request(f"{param}.content: only text parts are supported", param)
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise bad_request(f"{param}.content must be text", param)
    return {"role": CHAT_ROLES[message["role"]], "content": content}


def _common(body: dict, max_tokens: Any) -> dict[str, Any]:
    """The parameters completions and chat share."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model is required", "model")
    for name, unused in _UNSUPPORTED.items():
        if body.get(name) not in unused:
            raise bad_request(f"{name} is not supported by this server", name)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise bad_request("stream must be true or false", "stream")
    options = body.get("stream_options")
    if options is not None and not stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    include_usage = (
        False
        if options is None
        else options.get("include_usage", False)
        if isinstance(options, dict)
        else None
    )
    if not isinstance(include_usage, bool):
        raise bad_request("stream_options.include_usage must be true or false", "stream_options")
    self_refine, ignore_eos, include_stop = (
        _flag(body, name) for name in ("self_refine", "ignore_eos", "include_stop_str_in_output")
    )
    max_tokens = _positive_integer(max_tokens, "max_tokens")
    return {
        "model": model,
        "max_tokens": max_tokens,
        "min_tokens": _min_tokens(body.get("min_tokens"), max_tokens),
        "temperature": _number_within(body.get("temperature"), "temperature", 0.0, 2.0),
        "top_p": _number_within(body.get("top_p"), "top_p", 0.0, 1.0, open_low=True),
        "top_k": _top_k(body.get("top_k")),
        "min_p": _number_within(body.get("min_p"), "min_p", 0.0, 1.0),
        "seed": _seed(body.get("seed")),
        "ignore_eos": ignore_eos,
        "stop": _stop(body.get("stop")),
        "include_stop_str_in_output": include_stop,
        "stop_token_ids": _stop_token_ids(body.get("stop_token_ids")),
        "logit_bias": _logit_bias(body.get("logit_bias")),
        "presence_penalty": _penalty_within_openais_range(body, "presence_penalty"),
        "frequency_penalty": _penalty_within_openais_range(body, "frequency_penalty"),
        "repetition_penalty": _repetition_penalty(body.get("repetition_penalty")),
        "stream": stream,
        "include_usage": include_usage,
        "n": _positive_integer(body.get("n"), "n") or 1,
        "self_refine": self_refine,
    }


def _flag(body: dict, name: str) -> bool:
    """A true-or-false field of vLLM's; absent or null: false."""
    value = body.get(name) or False
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be true or false", name)
    return value


def _positive_integer(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_request(f"{name} must be a positive integer", name)
    return value


def _min_tokens(value: Any, max_tokens: int | None) -> int:
    """vLLM's `min_tokens`: 0 (or absent) is no minimum; never above ``max_tokens`` (the
    pipeline checks it against its default where the request sets none)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_request("min_tokens must be a non-negative integer", "min_tokens")
    if max_tokens is not None and value > max_tokens:
        raise bad_request(f"min_tokens={value} is more than max_tokens={max_tokens}", "min_tokens")
    return value


def _completion_logprobs(value: Any, top: Any) -> int | None:
    """A completion's `logprobs`: how many alternatives per token (0: the chosen token's
    log-probability alone); absent, null or false: none."""
    if top not in (None, 0):
        raise bad_request(
            "top_logprobs belongs to chat completions; a completion sets logprobs", "top_logprobs"
        )
    if value is None or value is False:
        return None
    return _logprobs_count(value, "logprobs")


def _chat_logprobs(value: Any, top: Any) -> int | None:
    """A chat's `logprobs` (true or false) and `top_logprobs` (alternatives, 0 to 20, only
    with logprobs true)."""
    if value is not None and not isinstance(value, bool):
        raise bad_request("logprobs must be true or false", "logprobs")
    alternatives = 0 if top is None else _logprobs_count(top, "top_logprobs")
    if not value:
        if alternatives:
            raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")
        return None
    return alternatives


def _logprobs_count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS:
        raise bad_request(f"{name} must be an integer from 0 to {MAX_LOGPROBS}", name)
    return value


def _penalty_within_openais_range(body: dict, name: str) -> float | None:
    """OpenAI's presence and frequency penalties, in [-2, 2]."""
    return _number_within(body.get(name), name, -MAX_PENALTY, MAX_PENALTY)


def _repetition_penalty(value: Any) -> float | None:
    """vLLM's `repetition_penalty`: above 1 discourages tokens of the prompt and the output."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise bad_request("repetition_penalty must be a number > 0 (1 is none)", "repetition_penalty")
    return float(value)


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's `logit_bias`: token ids (as JSON object keys) to values in [-100, 100]."""
    if value is None:
        return ()
    message = (
        f"logit_bias must map at most {MAX_LOGIT_BIAS_ENTRIES} token ids to numbers in "
        f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]"
    )
    if not isinstance(value, dict) or len(value) > MAX_LOGIT_BIAS_ENTRIES:
        raise bad_request(message, "logit_bias")
    pairs = []
    for key, bias in value.items():
        token = key.strip() if isinstance(key, str) else ""
        if not token.isdigit() or isinstance(bias, bool) or not isinstance(bias, int | float):
            raise bad_request(message, "logit_bias")
        if not (math.isfinite(bias) and abs(bias) <= MAX_LOGIT_BIAS) or int(token) >= 1 << 31:
            raise bad_request(message, "logit_bias")
        pairs.append((int(token), float(bias)))
    return tuple(pairs)


def _stop_token_ids(value: Any) -> tuple[int, ...]:
    ids = value or []
    if (
        not isinstance(ids, list)
        or len(ids) > MAX_STOP_TOKEN_IDS
        or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 31 for i in ids)
    ):
        raise bad_request(
            f"stop_token_ids must be a list of at most {MAX_STOP_TOKEN_IDS} token ids", "stop_token_ids"
        )
    return tuple(ids)


def _top_k(value: Any) -> int | None:
    """vLLM's `top_k`: how many of the likeliest tokens to sample from; -1 or 0 turn it off."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise bad_request("top_k must be an integer: -1 or 0 (off), or how many tokens to keep", "top_k")
    return max(value, 0)


def _seed(value: Any) -> int | None:
    """`seed` as the pipeline's `random_seed` (UINT64): a negative seed by its two's
    complement, so every 64-bit integer a client sends is a seed of its own."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not -(1 << 63) <= value < 1 << 64:
        raise bad_request("seed must be an integer of at most 64 bits", "seed")
    return value % (1 << 64)


def _number_within(value: Any, name: str, low: float, high: float, open_low: bool = False) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise bad_request(f"{name} must be a number", name)
    if value > high or value < low or (open_low and value == low):
        bound = "(" if open_low else "["
        raise bad_request(f"{name} must lie in {bound}{low:g}, {high:g}]", name)
    return float(value)


def _stop(value: Any) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value or []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("stop must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise bad_request(
            f"stop: at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_CHARS} characters", "stop"
        )
    return tuple(s for s in stops if s)
