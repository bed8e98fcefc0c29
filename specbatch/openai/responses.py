"""OpenAI response objects: completions, chat completions, their stream chunks, usage."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace

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
        # a streamed completion's text_offset runs on from chunk to chunk, per choice
        self._offsets: dict[int, int] = {}

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.call.model,
            "choices": choices,
        }

    def complete(self, outcomes: Sequence[Outcome]) -> dict:
        """The whole answer of a request that did not stream: every copy the pipeline ran
        counts in `usage`, the ``n`` likeliest of each prompt's are its choices."""
        chosen = self._likeliest(outcomes)
        if self.call.kind == "chat":
            choices = [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": o.text},
                    "logprobs": self.logprobs(o),
                    "finish_reason": o.finish_reason,
                }
                for i, o in enumerate(chosen)
            ]
        else:
            choices = [
                {
                    "index": i,
                    "text": (self.call.prompt_of_choice(i) if self.call.echo else "") + o.text,
                    "logprobs": self.logprobs(o),
                    "finish_reason": o.finish_reason,
                }
                for i, o in enumerate(chosen)
            ]
        return {**self._envelope(self.object, choices), "usage": usage(outcomes, self.call.copies)}

    def _likeliest(self, outcomes: Sequence[Outcome]) -> list[Outcome]:
        """Of each prompt's ``best_of`` copies, the ``n`` with the highest total
        log-probability (vLLM's rule; ties, and answers not generated, keep their order),
        without the log-probabilities the client did not ask for."""
        call = self.call
        if call.copies == call.n:
            return list(outcomes)
        chosen = []
        for start in range(0, len(outcomes), call.copies):
            copies = outcomes[start : start + call.copies]
            chosen += sorted(copies, key=lambda o: -_total_logprob(o))[: call.n]
        return chosen if call.logprobs is not None else [replace(o, logprobs="") for o in chosen]

    def logprobs(self, outcome: Outcome) -> dict | None:
        """A choice's `logprobs` object, in the form its endpoint uses; None where none
        were asked for or none were made (an answer computed or scored, not generated)."""
        return self.chunk_logprobs(outcome.logprobs)

    def chunk_logprobs(self, pipeline_json: str, index: int | None = None) -> dict | None:
        """The `logprobs` object of the tokens in ``pipeline_json`` (the pipeline's
        token_logprobs); with the ``index`` of a streamed choice, a completion's text
        offsets go on from where that choice's previous chunk ended, as vLLM counts them;
        a streamed choice's last chunk, whose tokens all went before, has none."""
        if not pipeline_json:
            return None
        entries = json.loads(pipeline_json)
        if not entries and index is not None:
            return None
        if self.call.kind == "chat":
            return {"content": [_chat_entry(e, e["top_logprobs"]) for e in entries]}
        offsets = []
        offset = 0 if index is None else self._offsets.get(index, 0)
        for entry in entries:
            offsets.append(offset)
            offset += len(entry["token"])
        if index is not None:
            self._offsets[index] = offset
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            # the chosen token and its alternatives, as vLLM lists them
            "top_logprobs": [{a["token"]: a["logprob"] for a in [e, *e["top_logprobs"]]} for e in entries],
            "text_offset": offsets,
        }

    def chunk(
        self,
        index: int,
        text: str | None = None,
        finish_reason: str | None = None,
        role: bool = False,
        logprobs: dict | None = None,
    ) -> dict:
        """One stream chunk: new text of choice `index`, its role (chat's first chunk), or
        its end (with its `logprobs`, when it has them)."""
        if self.call.kind == "chat":
            delta: dict = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        else:
            choice = {
                "index": index,
                "text": text or "",
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
        envelope = self._envelope(self.chunk_object, [choice])
        if self.call.include_usage:
            envelope["usage"] = None
        return envelope

    def usage_chunk(self, outcomes: Sequence[Outcome]) -> dict:
        """The last chunk when `stream_options.include_usage` asked for it: no choices, the usage."""
        return {**self._envelope(self.chunk_object, []), "usage": usage(outcomes, self.call.copies)}


def _total_logprob(outcome: Outcome) -> float:
    return sum(entry["logprob"] for entry in json.loads(outcome.logprobs)) if outcome.logprobs else 0.0


def _chat_entry(entry: dict, alternatives: list[dict] | None = None) -> dict:
    """One token as a chat's `logprobs.content` lists it: its text, log-probability, UTF-8
    bytes and, for a chosen token, its alternatives."""
    token = {"token": entry["token"], "logprob": entry["logprob"], "bytes": list(entry["token"].encode())}
    if alternatives is not None:
        token["top_logprobs"] = [_chat_entry(a) for a in alternatives]
    return token


def usage(outcomes: Sequence[Outcome], n: int = 1) -> dict:
    """Tokens of the reply: each prompt's once however many choices it has (``n`` copies
    in a row, as OpenAI and vLLM count them), every choice's completion."""
    prompt = sum(o.num_input_tokens for o in outcomes[::n])
    completion = sum(o.num_output_tokens for o in outcomes)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
