"""vLLM's min_p: a filter both models sample through, so speculation stays exact."""

from __future__ import annotations

import pytest
from pairs import prompts

from specbatch.decoding import Engine, GenerationRequest, UnrunnableRequestError


def test_min_p_one_keeps_only_the_likeliest_token_so_sampling_is_greedy(pair) -> None:
    rows = prompts(3, pair.vocab_size, seed=8, min_len=4, max_len=12)
    engine = Engine(pair, lookahead=4)
    greedy = engine.generate([GenerationRequest(r, max_new_tokens=12) for r in rows], mode="target_only")
    for seed in (None, 99):
        for mode in ("speculative", "target_only"):
            options = {"max_new_tokens": 12, "temperature": 1.0, "min_p": 1.0, "seed": seed}
            sampled = engine.generate([GenerationRequest(r, **options) for r in rows], mode=mode)
            assert [s.tokens for s in sampled] == [g.tokens for g in greedy], (seed, mode)


def test_a_seeded_row_with_min_p_is_the_same_speculated_or_not(pair) -> None:
    request = GenerationRequest(
        prompts(1, pair.vocab_size, seed=6, min_len=5, max_len=5)[0],
        max_new_tokens=24,
        temperature=1.2,
        min_p=0.05,
        seed=77,
    )
    engine = Engine(pair, lookahead=5)
    assert engine.generate([request])[0].tokens == engine.generate([request], mode="target_only")[0].tokens


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_a_min_p_outside_zero_to_one_is_refused(value: float, pair) -> None:
    with pytest.raises(UnrunnableRequestError, match="min_p"):
        Engine(pair).validate(GenerationRequest([5, 6], min_p=value))
