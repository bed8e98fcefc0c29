"""Log-probabilities of output tokens: the target's own, whatever drafted the token."""

from __future__ import annotations

import pytest
import torch
from pairs import make_pair, prompts

from specbatch.decoding import Engine, GenerationRequest, UnrunnableRequestError
from specbatch.logprobs import MAX_LOGPROBS

# Hugging Face's Qwen3 builds its rotary tables in float32 even for a float64 model, so
# its logits sit about 1e-7 from ours; speculative against target-only is held tighter.
HF_TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}


def _reference_log_probs(pair, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log_softmax of the Hugging Face target's logits at each output position [T, V]."""
    ids = prompt + tokens
    with torch.no_grad():
        logits = pair.hf_target(torch.tensor([ids])).logits[0, len(prompt) - 1 : len(ids) - 1]
    return torch.log_softmax(logits[:, : pair.vocab_size].to(torch.float64), dim=-1)


@pytest.mark.parametrize("mode", ["speculative", "target_only"])
def test_logprobs_are_the_targets_raw_log_probabilities_of_each_token(mode: str, pair) -> None:
    rows = prompts(4, pair.vocab_size, seed=21, min_len=3, max_len=20)
    asked = [3, 0, None, MAX_LOGPROBS]
    requests = [
        GenerationRequest(row, max_new_tokens=12, logprobs=n, temperature=t)
        for row, n, t in zip(rows, asked, [0.0, 0.8, 0.0, 0.0], strict=True)
    ]
    results = Engine(pair, lookahead=4).generate(requests, mode=mode)
    assert results[2].logprobs is None, "a row that does not ask gets none"
    for row, n, result in zip(rows, asked, results, strict=True):
        if n is None:
            continue
        assert [lp.token for lp in result.logprobs] == result.tokens
        reference = _reference_log_probs(pair, row, result.tokens)
        chosen = reference.gather(1, torch.tensor(result.tokens).unsqueeze(1)).squeeze(1)
        logprobs = torch.tensor([lp.logprob for lp in result.logprobs], dtype=torch.float64)
        torch.testing.assert_close(logprobs, chosen, **HF_TOLERANCE)
        top_values, top_ids = reference.topk(n, dim=-1)
        for position, lp in enumerate(result.logprobs):
            assert [token for token, _ in lp.top] == top_ids[position].tolist()
            torch.testing.assert_close(
                torch.tensor([v for _, v in lp.top], dtype=torch.float64),
                top_values[position],
                **HF_TOLERANCE,
            )
        if n:  # greedy: the token is the most likely one
            assert all(lp.top[0][0] == lp.token for lp in result.logprobs)


def test_speculative_and_target_only_report_the_same_logprobs_when_a_stop_string_cuts_the_row(pair) -> None:
    engine = Engine(pair, lookahead=5)
    prompt = prompts(1, pair.vocab_size, seed=4, min_len=6, max_len=6)[0]
    free = engine.generate([GenerationRequest(prompt, max_new_tokens=20)], mode="target_only")[0]
    text = pair.tokenizer.decode(free.tokens, skip_special_tokens=True)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    request = GenerationRequest(prompt, max_new_tokens=20, stop=[stop], logprobs=2)
    speculative, target_only = (
        engine.generate([request], mode=mode)[0] for mode in ("speculative", "target_only")
    )
    assert speculative.finish_reason == "stop" and speculative.tokens == target_only.tokens
    assert len(speculative.logprobs) == len(speculative.tokens) < 20
    for a, b in zip(speculative.logprobs, target_only.logprobs, strict=True):
        assert a.token == b.token and [t for t, _ in a.top] == [t for t, _ in b.top]
        assert a.logprob == pytest.approx(b.logprob, abs=1e-9)


@pytest.mark.parametrize("value", [-1, MAX_LOGPROBS + 1, True, 1.5])
def test_a_logprobs_count_out_of_range_is_refused(value, pair) -> None:
    with pytest.raises(UnrunnableRequestError, match="logprobs"):
        Engine(pair).validate(GenerationRequest([5, 6], logprobs=value))


def test_a_pair_in_float32_reports_finite_logprobs() -> None:
    pair32 = make_pair("controlled", dtype=torch.float32)
    result = Engine(pair32, lookahead=3).generate(
        [GenerationRequest([7, 8, 9], max_new_tokens=8, logprobs=1)]
    )[0]
    assert len(result.logprobs) == 8
    assert all(lp.logprob <= 0.0 and lp.top[0][1] >= lp.logprob for lp in result.logprobs)
