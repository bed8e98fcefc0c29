"""Open-instruction (InfoBench) prompts: split instruction and input, build the engine prompt.

The request rendering (``Instruction: … Question: … Generation:``) is already a raw
completion prompt; the dataset rendering (a bare instruction, its input after a blank
line) is put into that same frame so the model always sees one layout. The Qwen3 chat
template with thinking disabled is the alternative for chat-tuned use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from .errors import RoutingError
from .text import normalize_newlines

_INSTRUCTION_MARKER = re.compile(r"^[ \t]*instruction[ \t]*:[ \t]*", re.IGNORECASE | re.MULTILINE)
_INPUT_MARKER = re.compile(r"^[ \t]*(?:question|input)[ \t]*:[ \t]*", re.IGNORECASE | re.MULTILINE)
_GENERATION_CUE = re.compile(r"\n?[ \t]*generation[ \t]*:[ \t]*$", re.IGNORECASE)
_BLANK_LINE = re.compile(r"\n[ \t]*\n")

QWEN3_NO_THINKING_TEMPLATE = (
    "<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)


@dataclass(frozen=True)
class InfoBenchPrompt:
    """An open instruction, its input (possibly empty), and the rendering it arrived in.

    ``preamble`` is any text a client put before the ``Instruction:`` marker; it is kept.
    """

    instruction: str
    input: str
    rendering: Literal["request", "dataset"]
    preamble: str = ""


def has_instruction_marker(text: str) -> bool:
    """True when a line starts with ``Instruction:``."""
    return _INSTRUCTION_MARKER.search(text) is not None


def ends_with_generation_cue(text: str) -> bool:
    """True when the text ends in the request rendering's ``Generation:`` cue.

    Compared at the end of the text rather than searched for: the router asks this of
    every prompt, and a search for an end-anchored pattern still walks the whole text.
    """
    stripped = text.rstrip()
    return stripped.endswith(":") and stripped[:-1].rstrip(" \t")[-10:].lower() == "generation"


def parse_infobench(prompt: str) -> InfoBenchPrompt:
    """Split either rendering into instruction and input.

    Raises :class:`RoutingError` for an empty prompt or an ``Instruction:`` marker with
    nothing after it.
    """
    text = normalize_newlines(prompt).strip()
    if not text:
        raise RoutingError("empty instruction prompt")
    marker = _INSTRUCTION_MARKER.search(text)
    if marker is None:
        parts = _BLANK_LINE.split(text, maxsplit=1)
        instruction = parts[0].strip()
        given_input = parts[1].strip() if len(parts) > 1 else ""
        return InfoBenchPrompt(instruction, given_input, "dataset")
    body = _GENERATION_CUE.sub("", text[marker.end() :])
    question = _INPUT_MARKER.search(body)
    instruction = (body[: question.start()] if question else body).strip()
    given_input = body[question.end() :].strip() if question else ""
    if not instruction:
        raise RoutingError("the prompt has an 'Instruction:' marker but no instruction after it")
    return InfoBenchPrompt(instruction, given_input, "request", preamble=text[: marker.start()])


def _think_hint(think_tokens: int | None) -> str:
    if think_tokens is None:
        return ""
    if isinstance(think_tokens, bool) or not isinstance(think_tokens, int) or think_tokens < 1:
        raise RoutingError(f"think_tokens must be a positive integer, got {think_tokens!r}")
    return f" Think for {think_tokens} tokens."


def infobench_chat_content(prompt: str, *, think_tokens: int | None = None) -> str:
    """The user turn of an open instruction in chat form: the instruction, then its input.

    A chat model needs no ``Instruction:``/``Generation:`` frame: the template marks
    whose turn it is, so either rendering becomes the bare instruction and its input.
    """
    parsed = parse_infobench(prompt)
    instruction = parsed.instruction + _think_hint(think_tokens)
    return f"{parsed.preamble}{instruction}" + (f"\n\n{parsed.input}" if parsed.input else "")


def build_infobench_prompt(
    prompt: str,
    *,
    think_tokens: int | None = None,
    chat_template: bool = False,
    tokenizer: Any = None,
) -> str:
    """The text the engine completes for an open instruction.

    By default a raw completion prompt in the request rendering (``Instruction: …
    Question: … Generation:``); a request-rendered prompt comes back unchanged apart from
    line ends and the optional hint. ``think_tokens`` appends the conciseness hint
    ``Think for N tokens.`` to the instruction. ``chat_template=True`` renders one user
    turn with the Qwen3 chat template and thinking disabled — through
    ``tokenizer.apply_chat_template`` when a tokenizer is given, else Qwen3's own layout.
    """
    if not chat_template:
        parsed = parse_infobench(prompt)
        instruction = parsed.instruction + _think_hint(think_tokens)
        return f"{parsed.preamble}Instruction: {instruction}\nQuestion: {parsed.input}\nGeneration:"
    content = infobench_chat_content(prompt, think_tokens=think_tokens)
    if tokenizer is None:
        return QWEN3_NO_THINKING_TEMPLATE.format(content=content)
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": content}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
