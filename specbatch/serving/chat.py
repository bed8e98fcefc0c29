"""Qwen3's chat format for one prompt: the conversation around it, and its rendering.

Qwen3-8B is a chat model: without its template a raw prompt ends unpredictably on real
weights. A prompt that asks for chat (`chat` input) travels as its user turn plus a
`ChatFormat` (earlier turns, the thinking switch, and for scoring the start of the
assistant's answer), so the router and the task handlers still see the user's own
text. The scheduler renders it with the target tokenizer's chat template
(`specbatch.serving.target_text`) and sends the instance the rendered text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from specbatch.serving.params import PromptError

ROLES = ("system", "user", "assistant")
MAX_HISTORY_TURNS = 256


@dataclass(frozen=True)
class ChatFormat:
    """How one prompt is wrapped: earlier (role, content) turns, thinking, an answer prefix.

    `enable_thinking` False is Qwen3's non-thinking mode (the template closes an empty
    think block); `assistant_prefix` is text the assistant's turn starts with, which
    the model continues (the mmlu scorer puts its answer cue there).
    """

    history: tuple[tuple[str, str], ...] = ()
    enable_thinking: bool = False
    assistant_prefix: str = ""

    def history_json(self) -> str:
        return json.dumps([{"role": role, "content": content} for role, content in self.history])


def parse_history(raw: bytes | str | None) -> tuple[tuple[str, str], ...]:
    """Earlier turns from their JSON form (`[{"role": ..., "content": ...}, ...]`; "" = none)."""
    if raw is None:
        return ()
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    if not text.strip():
        return ()
    try:
        turns = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PromptError(f"chat_history is not JSON: {exc.msg} at character {exc.pos}") from None
    if not isinstance(turns, list) or len(turns) > MAX_HISTORY_TURNS:
        raise PromptError(f"chat_history must be a JSON list of at most {MAX_HISTORY_TURNS} messages")
    history = []
    for position, turn in enumerate(turns):
        if (
            not isinstance(turn, dict)
            or turn.get("role") not in ROLES
            or not isinstance(turn.get("content"), str)
        ):
            raise PromptError(
                f"chat_history[{position}] must be {{'role': one of {', '.join(ROLES)}, 'content': text}}"
            )
        if turn["role"] == "system" and position > 0:
            raise PromptError("chat_history: a system message may only come first")
        history.append((turn["role"], turn["content"]))
    return tuple(history)
