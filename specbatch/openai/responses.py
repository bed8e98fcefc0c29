"""OpenAI response objects: completions, chat completions, their stream chunks, usage."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from specbatch.openai.requests import Call
from specbatch.openai.upstream import Outcome


class Reply:
    """The objects of one response: one id and creation time shared by every chunk."""

    def __init__(self, call: Call) -> None:
        self.call = call
        chat = call.kind == "chat"
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.chunk_object = "chat.completion.chunk" if chat else "text_completion"

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.call.model,
            "choices": choices,
        }

    def complete(self, outcomes: Sequence[Outcome]) -> dict:
        """The whole answer of a request that did not stream."""
        if self.call.kind == "chat":
            choices = [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": o.text},
                    "logprobs": None,
                    "finish_reason": o.finish_reason,
                }
                for i, o in enumerate(outcomes)
            ]
        else:
            choices = [
                {"index": i, "text": o.text, "logprobs": None, "finish_reason": o.finish_reason}
                for i, o in enumerate(outcomes)
            ]
        return {**self._envelope(self.object, choices), "usage": usage(outcomes, self.call.n)}

    def chunk(
        self, index: int, text: str | None = None, finish_reason: str | None = None, role: bool = False
    ) -> dict:
        """One stream chunk: new text of choice `index`, its role (chat's first chunk), or its end."""
        if self.call.kind == "chat":
            delta: dict = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        envelope = self._envelope(self.chunk_object, [choice])
        if self.call.include_usage:
            envelope["usage"] = None
        return envelope

    def usage_chunk(self, outcomes: Sequence[Outcome]) -> dict:
        """The last chunk when `stream_options.include_usage` asked for it: no choices, the usage."""
        return {**self._envelope(self.chunk_object, []), "usage": usage(outcomes, self.call.n)}


def usage(outcomes: Sequence[Outcome], n: int = 1) -> dict:
    """Tokens of the reply: each prompt's once however many choices it has (``n`` copies
    in a row, as OpenAI and vLLM count them), every choice's completion."""
    prompt = sum(o.num_input_tokens for o in outcomes[::n])
    completion = sum(o.num_output_tokens for o in outcomes)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
