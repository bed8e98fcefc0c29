"""Serving helpers for tests with and without models: a target that counts words, a
message as the other end of the socket reads it, a reply sink that records what the
client would receive, and logprobs compared up to float rounding."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

from specbatch.serving.framing import HEADER, unpack
from specbatch.serving.messages import Message, RowOutcome, decode, encode
from specbatch.serving.target_text import TargetText


def word_target(max_context: int, template: Any = None) -> TargetText:
    """A target whose tokens are whitespace-separated words (``len(text.split())``), with an
    optional chat template (anything with jinja's ``render(**context)``)."""
    tokenizer = Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    return TargetText(tokenizer, max_context, template)


def over_the_wire(message: Message) -> Message:
    """``message`` as the other end of the socket reads it."""
    return decode(unpack(encode(message)[HEADER.size :]))


class RecordingReply:
    """A request's reply sink: every delta ``(index, task, text)`` in the order sent, every
    final answer, and a cancelled flag a test sets. ``on_change`` is called after each.
    With ``refuse_deltas`` a delta fails the test (the request did not ask to stream)."""

    def __init__(self, on_change: Callable[[], None] = lambda: None, *, refuse_deltas: bool = False) -> None:
        self.deltas: list[tuple[int, str, str]] = []
        self.delta_logprobs: list[tuple[int, str]] = []  # (index, JSON) beside each delta
        self.finals: list[list[RowOutcome]] = []
        self.cancelled = False
        self._on_change = on_change
        self._refuse_deltas = refuse_deltas

    def delta(self, index: int, task: str, text: str, logprobs: str = "") -> None:
        assert not self._refuse_deltas, "nothing streams in a request that did not ask to"
        self.deltas.append((index, task, text))
        self.delta_logprobs.append((index, logprobs))
        self._on_change()

    def final(self, outcomes: list[RowOutcome]) -> None:
        self.finals.append(outcomes)
        self._on_change()

    def is_cancelled(self) -> bool:
        return self.cancelled

    def pieces(self, index: int) -> list[str]:
        """The texts streamed for prompt ``index``, in order."""
        return [text for i, _, text in self.deltas if i == index]

    def streamed(self, index: int) -> str:
        return "".join(self.pieces(index))

    def tasks_streamed(self, index: int) -> set[str]:
        return {task for i, task, _ in self.deltas if i == index}


def within_rounding(reported: list[dict], expected: list[dict]) -> bool:
    """The same tokens and alternatives with the same logprobs up to float rounding: two rows
    decoded side by side sit at different places in each batch, and the sums behind a
    log-softmax may then round apart in the last bits (tokens are exact, logprobs are not)."""

    def shape(entries: list[dict]) -> list:
        return [(e["id"], e["token"], [(t["id"], t["token"]) for t in e["top_logprobs"]]) for e in entries]

    def values(entries: list[dict]) -> list[float]:
        return [v for e in entries for v in (e["logprob"], *(t["logprob"] for t in e["top_logprobs"]))]

    same_values = values(reported) == pytest.approx(values(expected), abs=1e-9)
    return shape(reported) == shape(expected) and same_values
