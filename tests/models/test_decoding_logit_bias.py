"""OpenAI's logit_bias: added to both models' logits, so speculation stays exact."""

from __future__ import annotations

import pytest
import torch
from pairs import prompts

from specbatch.decoding import Engine, GenerationRequest, UnrunnableRequestError


def _reference(pair, prompt: list[int], tokens: int, bias: dict[int, float]) -> list[int]:
    """Greedy decoding of the Hugging Face target with the bias added, one forward per token."""
    output: list[int] = []
    for _ in range(tokens):
        with torch.no_grad():
            logits = pair.hf_target(torch.tensor([prompt + output])).logits[0, -1, : pair.vocab_size].double()
        for token, value in bias.items():
            logits[token] += value
        output.append(int(logits.argmax()))
    return output


def test_greedy_rows_with_a_logit_bias_decode_the_biased_targets_argmax(pair) -> None:
    rows = prompts(3, pair.vocab_size, seed=13, min_len=4, max_len=12)
    free = Engine(pair).generate([GenerationRequest(r, max_new_tokens=12) for r in rows], mode="target_only")
    banned, favoured = free[0].tokens[0], free[1].tokens[3]
    bias = {banned: -100.0, favoured: 4.0}
    requests = [GenerationRequest(r, max_new_tokens=12, logit_bias=tuple(bias.items())) for r in rows]
    engine = Engine(pair, lookahead=4)
    plain = GenerationRequest(rows[0], max_new_tokens=12)
    for mode in ("speculative", "target_only"):
        *results, unbiased = engine.generate([*requests, plain], mode=mode)
        for row, result in zip(rows, results, strict=True):
            assert result.tokens == _reference(pair, row, 12, bias), mode
            assert banned not in result.tokens
        assert unbiased.tokens == free[0].tokens, "a row without a bias beside them keeps its answer"


@pytest.mark.parametrize("bias", [((10**6, 1.0),), ((5, float("nan")),), ((True, 1.0),)])
def test_a_logit_bias_outside_the_vocabulary_or_without_a_number_is_refused(bias, pair) -> None:
    with pytest.raises(UnrunnableRequestError, match="logit_bias"):
        Engine(pair).validate(GenerationRequest([5, 6], logit_bias=bias))
