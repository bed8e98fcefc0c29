"""Presence, frequency and repetition penalties, exact under speculation."""

from __future__ import annotations

import pytest
import torch
from pairs import prompts

from specbatch.decoding import Engine, GenerationRequest, UnrunnableRequestError

# (presence, frequency, repetition): each alone, and all three at once
PENALTIES = [(1.5, 0.0, 1.0), (0.0, 0.8, 1.0), (0.0, 0.0, 1.6), (0.5, 0.3, 1.3)]


def _reference(pair, prompt: list[int], tokens: int, presence: float, frequency: float, repetition: float):
    """Greedy decoding of the Hugging Face target with the penalties applied as vLLM
    applies them, one full forward per token."""
    output: list[int] = []
    for _ in range(tokens):
        with torch.no_grad():
            logits = pair.hf_target(torch.tensor([prompt + output])).logits[0, -1, : pair.vocab_size].double()
        for token in set(prompt + output):
            logits[token] = logits[token] / repetition if logits[token] > 0 else logits[token] * repetition
        for token in set(output):
            logits[token] -= frequency * output.count(token) + presence
        output.append(int(logits.argmax()))
    return output


@pytest.mark.parametrize("penalties", PENALTIES)
def test_greedy_rows_with_penalties_decode_the_penalized_targets_argmax(penalties, pair) -> None:
    presence, frequency, repetition = penalties
    rows = prompts(3, pair.vocab_size, seed=31, min_len=4, max_len=12)
    requests = [
        GenerationRequest(
            row,
            max_new_tokens=16,
            presence_penalty=presence,
            frequency_penalty=frequency,
            repetition_penalty=repetition,
        )
        for row in rows
    ]
    plain = GenerationRequest(rows[0], max_new_tokens=16)  # a row without penalties beside them
    engine = Engine(pair, lookahead=4)
    for mode in ("speculative", "target_only"):
        *penalized, unpenalized = engine.generate([*requests, plain], mode=mode)
        for row, result in zip(rows, penalized, strict=True):
            assert result.tokens == _reference(pair, row, 16, *penalties), mode
        assert unpenalized.tokens == _reference(pair, rows[0], 16, 0.0, 0.0, 1.0)
    assert penalized[0].tokens != unpenalized.tokens, "the penalties changed the answer"


def test_a_seeded_sampled_row_with_penalties_is_the_same_speculated_or_not(pair) -> None:
    request = GenerationRequest(
        prompts(1, pair.vocab_size, seed=2, min_len=6, max_len=6)[0],
        max_new_tokens=24,
        temperature=0.9,
        seed=1234,
        presence_penalty=0.7,
        frequency_penalty=0.2,
        repetition_penalty=1.2,
    )
    engine = Engine(pair, lookahead=5)
    speculative, target_only = (engine.generate([request], mode=m)[0] for m in ("speculative", "target_only"))
    assert speculative.tokens == target_only.tokens


@pytest.mark.parametrize(
    "change",
    [{"repetition_penalty": 0.0}, {"repetition_penalty": float("nan")}, {"presence_penalty": float("inf")}],
)
def test_penalties_without_meaning_are_refused(change: dict, pair) -> None:
    with pytest.raises(UnrunnableRequestError, match="penalty"):
        Engine(pair).validate(GenerationRequest([5, 6], **change))
