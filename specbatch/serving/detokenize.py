"""Incremental detokenization for streaming: text deltas that never split a character.

Decoding token by token garbles byte-level BPE: a multi-byte character spread over
two tokens decodes to U+FFFD halves, and SentencePiece-style leading spaces vanish
when a token is decoded alone. So each delta is the difference between decoding a
short window that ends at the new tokens and the same window without them, and text
is held back while it ends in an incomplete character.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    """Turns a growing token sequence into text deltas whose concatenation is the full text."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.emitted = ""

    def push(self, token_ids: Sequence[int]) -> str:
        """Add tokens; return the text they complete (possibly empty)."""
        self._ids.extend(token_ids)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(_INCOMPLETE):
            return ""
        delta = new_text[len(prefix_text) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self.emitted += delta
        return delta

    def finish(self, final_text: str) -> str:
        """The rest of `final_text` not yet emitted (the engine's text is authoritative)."""
        if not final_text.startswith(self.emitted):
            return ""
        rest = final_text[len(self.emitted) :]
        self.emitted = final_text
        return rest
