"""Per-row stopping: end-of-sequence and stop tokens, stop strings, the token budget and a minimum."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specbatch.logprobs import TokenLogprob


@dataclass
class RowOutput:
    """The tokens a row has produced so far and, once finished, why and with what text."""

    max_new_tokens: int
    stop: Sequence[str]
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: frozenset[int] = frozenset()
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    text: str | None = None
    # characters of the text of the first min_tokens tokens, once they are made: a stop
    # string counts only where it ends past them (they never change after)
    min_tokens_chars: int | None = None
    # one per kept token, when the row reports log-probabilities (None: it does not)
    logprobs: list[TokenLogprob] | None = None
    # the text ends with the stop string that ended the row, not right before it
    include_stop_str: bool = False


class StopRules:
    """Applies EOS (unless the row ignores it), the row's stop tokens (which end it as EOS
    does, with it kept last), stop strings and max_new_tokens to each step's new tokens.

    A stop string ends the row at the first token whose text completes it; the
    returned text stops right before the stop string (or right after it, for a row that
    includes it, vLLM's include_stop_str_in_output). Nothing ends a row within its
    first ``min_tokens`` tokens (vLLM's `min_tokens`): the sampler bans its end tokens
    there, the draft's and the target's alike (:func:`specbatch.decoding.sampling.ends_masked`),
    so none is drawn, and the rules here hold to the same bound for tokens they are given
    otherwise; only a stop string that a later token completes counts."""

    def __init__(self, eos_token_ids: set[int], decode: Callable[[list[int]], str]) -> None:
        self.eos_token_ids = eos_token_ids
        self.decode = decode

    def extend(
        self, row: RowOutput, new_tokens: Sequence[int], new_logprobs: Sequence[TokenLogprob] = ()
    ) -> list[int]:
        """Append what the row keeps of ``new_tokens`` (and of their ``new_logprobs``, when
        it reports them); return the kept tokens."""
        start = len(row.tokens)
        for token in new_tokens:
            row.tokens.append(token)
            ends = token in row.stop_token_ids or (token in self.eos_token_ids and not row.ignore_eos)
            if ends and len(row.tokens) > row.min_tokens:
                row.finish_reason = "stop"
                break
            if len(row.tokens) >= row.max_new_tokens:
                row.finish_reason = "length"
                break
        if row.stop:
            self._apply_stop_strings(row, start)
        if row.logprobs is not None:
            row.logprobs.extend(new_logprobs[: len(row.tokens) - start])
        return row.tokens[start:]

    def _apply_stop_strings(self, row: RowOutput, start: int) -> None:
        if len(row.tokens) <= row.min_tokens:
            return
        if row.min_tokens_chars is None:
            row.min_tokens_chars = len(self.decode(row.tokens[: row.min_tokens])) if row.min_tokens else 0
        floor = row.min_tokens_chars
        if _first_stop(self.decode(row.tokens), row.stop, floor) is None:
            return
        for end in range(max(start, row.min_tokens) + 1, len(row.tokens) + 1):
            text = self.decode(row.tokens[:end])
            found = _first_stop(text, row.stop, floor)
            if found is not None:
                at, stop = found
                del row.tokens[end:]
                row.finish_reason = "stop"
                row.text = text[: at + len(stop)] if row.include_stop_str else text[:at]
                return

    def finish(self, row: RowOutput, reason: str | None = None) -> None:
        """Settle the row's text (and reason, e.g. "cancelled") once it leaves the batch."""
        if reason is not None and row.finish_reason is None:
            row.finish_reason = reason
        if row.text is None:
            row.text = self.decode(row.tokens)


def _first_stop(text: str, stops: Sequence[str], completed_after: int = 0) -> tuple[int, str] | None:
    """Where the first stop string in ``text`` that ends past character ``completed_after``
    starts, and which it is (the first listed of those starting there), or None."""
    found = [(text.find(s, max(0, completed_after - len(s) + 1)), s) for s in stops]
    found = [(index, s) for index, s in found if index >= 0]
    return min(found, key=lambda pair: pair[0]) if found else None
