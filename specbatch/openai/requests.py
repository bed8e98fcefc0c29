"""OpenAI request bodies, validated into one `Call` the pipeline understands.

What the pipeline cannot honour is refused with a 400 naming the parameter, never
silently ignored: logprobs, echo, `best_of`, tools, token-id prompts,
penalties and logit biases (the sampler has none), structured output (`response_format`
other than text, vLLM's guided decoding), and the vLLM extensions `min_p` and
`stop_token_ids`. Each is accepted at the value that means "not used", as clients
send their defaults. vLLM's `top_k` extension is honoured (-1 or 0: off), and so is its
`ignore_eos` (true: the answer runs to `max_tokens` through end-of-sequence tokens, the
fixed output lengths load testers ask for, e.g. AIPerf's `--extra-inputs ignore_eos:true`).
vLLM's `min_tokens` is honoured: neither end of sequence nor a stop string ends an answer
before that many tokens (an end-of-sequence token there is kept and decoding goes on).
`seed` is honoured as the pipeline's `random_seed`: a sampled prompt with a seed gives
the same tokens in any batch (greedy decoding, temperature 0, does so without one).
`n` choices per prompt run as that many copies of the prompt, the choices prompt by
prompt (choice `i * n + j` is copy `j` of prompt `i`, as OpenAI numbers them). Each copy
samples on its own seed: unseeded, each row draws one; with `seed`, copy 0 keeps it (its
answer is the one `n` = 1 gives) and copy `j` takes a seed mixed from it and `j`, so the
copies differ and the whole reply is reproducible. Greedy copies are all the same
answer, as in vLLM.
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

from specbatch.openai.errors import bad_request
from specbatch.serving.params import MAX_STOP_CHARS, MAX_STOP_STRINGS

MAX_PROMPTS = 64
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# Parameters the pipeline has no equivalent for, with the value that means "not used".
_UNSUPPORTED = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "tools": (None, []),
    "functions": (None, []),
    "logit_bias": (None, {}),
    "frequency_penalty": (None, 0),
    "presence_penalty": (None, 0),
    "repetition_penalty": (None, 1),
    "response_format": (None, {"type": "text"}),
    "tool_choice": (None, "none", "auto"),
    "min_p": (None, 0),
    "stop_token_ids": (None, []),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "use_beam_search": (None, False),
    "include_stop_str_in_output": (None, False),
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
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    chat_history: str = ""
    enable_thinking: bool = False
    self_refine: bool = False


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
    return Call(kind="completion", prompts=_copies(prompts, common["n"]), **common)


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
    common = _common(body, body.get("max_completion_tokens", body.get("max_tokens")))
    return Call(
        kind="chat",
        prompts=_copies([turns[-1]["content"]], common["n"]),
        chat_history=json.dumps(turns[:-1]) if len(turns) > 1 else "",
        enable_thinking=thinking,
        **common,
    )


def _copies(prompts: list[str], n: int) -> tuple[str, ...]:
    """Each prompt ``n`` times, prompt by prompt: the pipeline's prompts, one per choice."""
    if len(prompts) * n > MAX_PROMPTS:
        param = "n" if n > 1 else "prompt"
        raise bad_request(f"at most {MAX_PROMPTS} choices per request (prompts times n)", param)
    return tuple(prompt for prompt in prompts for _ in range(n))


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
    self_refine = body.get("self_refine") or False
    if not isinstance(self_refine, bool):
        raise bad_request("self_refine must be true or false", "self_refine")
    ignore_eos = body.get("ignore_eos") or False
    if not isinstance(ignore_eos, bool):
        raise bad_request("ignore_eos must be true or false", "ignore_eos")
    max_tokens = _positive_integer(max_tokens, "max_tokens")
    return {
        "model": model,
        "max_tokens": max_tokens,
        "min_tokens": _min_tokens(body.get("min_tokens"), max_tokens),
        "temperature": _number_within(body.get("temperature"), "temperature", 0.0, 2.0),
        "top_p": _number_within(body.get("top_p"), "top_p", 0.0, 1.0, open_low=True),
        "top_k": _top_k(body.get("top_k")),
        "seed": _seed(body.get("seed")),
        "ignore_eos": ignore_eos,
        "stop": _stop(body.get("stop")),
        "stream": stream,
        "include_usage": include_usage,
        "n": _positive_integer(body.get("n"), "n") or 1,
        "self_refine": self_refine,
    }


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
