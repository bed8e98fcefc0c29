"""vLLM's min_tokens: a row's end tokens (end-of-sequence unless it ignores it, and its
stop tokens) are banned until it has made min_tokens, in the draft's logits and the
target's alike, so a speculated row is still exactly the masked target's."""

from __future__ import annotations

import pytest
import torch
from pairs import make_pair, prompts

from specbatch.decoding import Engine, GenerationRequest, ModelPair

MAX_TOKENS = 30


def _reference(pair: ModelPair, prompt: list[int], min_tokens: int, ends: set[int]) -> list[int]:
    """Greedy decoding of the Hugging Face target, ``ends`` at -inf while fewer than
    ``min_tokens`` are made, ending at the first of them drawn after."""
    output: list[int] = []
    while len(output) < MAX_TOKENS:
        with torch.no_grad():
            logits = pair.hf_target(torch.tensor([prompt + output])).logits[0, -1, : pair.vocab_size].double()
        if len(output) < min_tokens:
            logits[sorted(ends)] = float("-inf")
        output.append(int(logits.argmax()))
        if output[-1] in ends:
            break
    return output


@pytest.fixture(scope="module")
def stopping(pair: ModelPair) -> tuple[list[list[int]], ModelPair, int, int]:
    """Six prompts and the session's pair with a token its first row makes early (its
    sixth) declared as end-of-sequence; and where row 0 would first end without a bound."""
    rows = prompts(6, pair.vocab_size, seed=21)
    requests = [GenerationRequest(p, max_new_tokens=MAX_TOKENS) for p in rows]
    free = Engine(pair).generate(requests, mode="target_only")
    eos = free[0].tokens[5]
    stopping = make_pair("controlled", epsilon=0.3, keep_eos=True)
    stopping.eos_token_ids.clear()
    stopping.eos_token_ids.add(eos)
    return rows, stopping, eos, free[0].tokens.index(eos) + 1


@pytest.mark.parametrize("mode", ["speculative", "target_only"])
def test_end_of_sequence_is_banned_until_min_tokens_and_ends_the_row_after(mode: str, stopping) -> None:
    rows, pair, eos, first_end = stopping
    least = [first_end + 2, 0, 12, 0, MAX_TOKENS, 3]
    requests = [
        GenerationRequest(p, max_new_tokens=MAX_TOKENS, min_tokens=least_tokens)
        for p, least_tokens in zip(rows, least, strict=True)
    ]
    results = Engine(pair, lookahead=4).generate(requests, mode=mode)
    for prompt, result, minimum in zip(rows, results, least, strict=True):
        assert result.tokens == _reference(pair, prompt, minimum, {eos}), (mode, minimum)
        assert eos not in result.tokens[:minimum], "banned before min_tokens"
        assert result.finish_reason == ("stop" if result.tokens[-1] == eos else "length")
    assert results[0].num_output_tokens > first_end, "row 0 ran past where it would have ended"


@pytest.mark.parametrize("mode", ["speculative", "target_only"])
def test_stop_tokens_are_banned_until_min_tokens_where_eos_is_ignored(mode: str, stopping) -> None:
    rows, pair, stop, _ = stopping  # a token row 0 makes early, here a stop token of rows ignoring EOS
    options = {"max_new_tokens": MAX_TOKENS, "stop_token_ids": [stop], "ignore_eos": True, "min_tokens": 8}
    results = Engine(pair, lookahead=4).generate([GenerationRequest(p, **options) for p in rows], mode=mode)
    for prompt, result in zip(rows, results, strict=True):
        assert result.tokens == _reference(pair, prompt, 8, {stop}), mode


def test_sampled_rows_draw_no_end_token_before_min_tokens_and_seeded_ones_reproduce(stopping) -> None:
    rows, pair, eos, _ = stopping
    requests = [
        GenerationRequest(p, max_new_tokens=24, min_tokens=16, temperature=1.0, seed=100 + i)
        for i, p in enumerate(rows)
    ]
    engine = Engine(pair, lookahead=4)
    speculated = engine.generate(requests, mode="speculative")
    plain = engine.generate(requests, mode="target_only")
    for fast, slow in zip(speculated, plain, strict=True):
        assert eos not in fast.tokens[:16] and len(fast.tokens) >= 16
        assert fast.tokens == slow.tokens, "a seeded row draws the same tokens under any K"
