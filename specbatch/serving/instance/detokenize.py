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
    """Turns a growing token sequence into text deltas whose concatenation is the full text.

    With stop strings, text that could be the start of one is held back: the engine cuts
    a row's text right before a stop string, so a streamed delta must never run past
    where the final text will end. `finish` releases what the final text keeps.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stop = tuple(s for s in stop if s)
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._held = ""
        self.emitted = ""

    def push(self, token_ids: Sequence[int]) -> str:
        """Add tokens; return the text they complete (possibly empty)."""
        self._ids.extend(token_ids)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(_INCOMPLETE):
            return ""
        delta = self._held + new_text[len(prefix_text) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        keep = self._releasable(delta)
        delta, self._held = delta[:keep], delta[keep:]
        self.emitted += delta
        return delta

    def _releasable(self, pending: str) -> int:
        """How much of `pending` cannot be part of a stop string (all of it without stops)."""
        if not self._stop:
            return len(pending)
        text = self.emitted + pending
        cut = len(text)
        for stop in self._stop:
            found = text.find(stop, max(0, len(self.emitted) - len(stop) + 1))
            if found >= 0:
                cut = min(cut, found)
            for size in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:size]):
                    cut = min(cut, len(text) - size)
                    break
        return max(0, cut - len(self.emitted))

    def finish(self, final_text: str) -> str:
        """The rest of `final_text` not yet emitted (the engine's text is authoritative)."""
        if not final_text.startswith(self.emitted):
            return ""
        rest = final_text[len(self.emitted) :]
        self.emitted = final_text
        return rest
