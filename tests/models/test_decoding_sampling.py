"""Speculative sampling must sample exactly the target's (filtered) distribution.

The filters and the verification rule on plain tensors are tested in tests/unit."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from pairs import letters_tokenizer, make_pair
from scipy.stats import chisquare

from specbatch.decoding import Engine, GenerationRequest
from specbatch.decoding.sampling import SamplingTensors, probabilities
from specbatch.decoding.tiny import PairSpec

VOCAB = 8
ENUMERABLE_SPEC = PairSpec(
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    draft_layers=1,
    extra_target_layers=1,
    max_position_embeddings=64,
)
PROMPT = [3, 5, 4]


def _exact_joint(pair, temperature: float, top_p: float, top_k: int) -> dict[tuple[int, int], float]:
    """P(first two tokens) under the target, straight from the Hugging Face model."""
    params = SamplingTensors.from_lists([temperature], [top_p], [top_k], torch.device("cpu"))
    with torch.no_grad():
        first = probabilities(pair.hf_target(torch.tensor([PROMPT])).logits[:, -1:], params)[0, 0]
        contexts = torch.tensor([[*PROMPT, t] for t in range(VOCAB)])
        second = probabilities(
            pair.hf_target(contexts).logits[:, -1:], params.keep_rows(torch.zeros(VOCAB, dtype=torch.long))
        )
    return {(a, b): float(first[a] * second[a, 0, b]) for a in range(VOCAB) for b in range(VOCAB)}


def _flat_pair():
    """An unrelated pair over 8 ids with logits scaled down, so that many two-token
    outcomes are likely and a wrong residual or a missing bonus token shows."""
    pair = make_pair("unrelated", tokenizer=letters_tokenizer(VOCAB), spec=ENUMERABLE_SPEC)
    with torch.no_grad():
        pair.hf_target.lm_head.weight.mul_(0.4)
        pair.hf_draft.lm_head.weight.mul_(0.4)
    return pair


SETTINGS = [(1.0, 1.0, 0), (1.2, 0.9, 5)]
# Compiled: unseeded rows (the residual rule) joining a running batch under top-k and
# top-p; seeded (Gumbel) rows are compared token for token in test_decoding_compiled.
RUNS = [(1, False, False), (3, False, False), (3, False, True), (3, True, True), ("goodput", True, True)]
DISTRIBUTION_CASES = [(*run, *settings, "none") for run in RUNS for settings in SETTINGS] + [
    pytest.param(3, False, True, *SETTINGS[1], "default", marks=pytest.mark.slow)
]


@pytest.mark.parametrize(
    ("lookahead", "seeded", "joining", "temperature", "top_p", "top_k", "compile"), DISTRIBUTION_CASES
)
def test_first_two_tokens_follow_the_target_distribution(
    lookahead: int | str,
    seeded: bool,
    joining: bool,
    temperature: float,
    top_p: float,
    top_k: int,
    compile: str,
) -> None:
    """Unseeded rows (residual rule) and seeded rows (Gumbel coupling) alike; ``joining``
    rows enter a batch that long rows are already running, a few at a time."""
    pair = _flat_pair()
    samples = 6000
    torch.manual_seed(0)  # unseeded rows take their key from torch's global generator
    requests = [
        GenerationRequest(
            PROMPT,
            max_new_tokens=4,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=i if seeded else None,
        )
        for i in range(samples)
    ]
    engine = Engine(pair, lookahead=lookahead, max_rows=48 if joining else samples, compile=compile)
    if joining:
        long_rows = [GenerationRequest([6, 3], max_new_tokens=60, temperature=1.0) for _ in range(8)]
        engine.submit_many(long_rows, _Discard())
    results = engine.generate(requests, mode="speculative")
    if lookahead != "goodput":
        drafted = sum(r.total_draft_tokens for r in results)
        assert sum(r.total_accepted_draft_tokens for r in results) / drafted > 0.05
    exact = _exact_joint(pair, temperature, top_p, top_k)
    observed = dict.fromkeys(exact, 0)
    for result in results:
        observed[tuple(result.tokens[:2])] += 1
    # pool the rare outcomes so every chi-square cell expects at least 5 samples
    common = [cell for cell, prob in exact.items() if prob * samples >= 5]
    assert len(common) >= 12, "the distribution is too peaked for the test to have power"
    rare = [cell for cell in exact if cell not in common and exact[cell] > 0]
    observed_counts = [observed[c] for c in common]
    expected_counts = [exact[c] * samples for c in common]
    if rare:
        observed_counts.append(sum(observed[c] for c in rare))
        expected_counts.append(sum(exact[c] for c in rare) * samples)
    assert sum(observed[c] for c in exact if exact[c] == 0) == 0, "sampled a token the filters exclude"
    assert sum(observed_counts) == samples
    # The draws depend on what ran before (compiled kernels draw their own random numbers),
    # so the p-value is uniform over runs for a correct sampler: at 1e-6 the eleven cases
    # refuse a correct sampler once in 90 000 runs, while a temperature off by 0.1 or a
    # top-k off by one still fails with probability 1 (non-centrality above 800).
    assert chisquare(observed_counts, expected_counts).pvalue > 1e-6


class _Discard:
    """A sink for rows whose output a test does not look at."""

    def on_tokens(self, updates: dict[int, list[int]]) -> None:
        pass

    def on_finished(self, key: int, result) -> None:
        pass


def test_seeded_rows_reproduce_in_any_batch_under_any_lookahead() -> None:
    """A seeded sampled row's output is the target's own seeded draw: the same alone, in
    company, with any K (fixed or chosen per step) and in target-only decoding."""
    pair = make_pair("controlled", epsilon=0.5)
    request = GenerationRequest([5, 9, 11, 40], max_new_tokens=24, temperature=0.9, top_p=0.95, seed=77)
    reference = Engine(pair).generate([request], mode="target_only")[0].tokens
    company = [GenerationRequest([7, 8], max_new_tokens=30, temperature=1.0, seed=s) for s in range(3)]
    for lookahead in (1, 3, 8, "adaptive_rule", "goodput"):
        engine = Engine(pair, lookahead=lookahead)
        assert engine.generate([request])[0].tokens == reference, lookahead
        assert engine.generate([*company, request])[-1].tokens == reference, lookahead
    other_seed = GenerationRequest([5, 9, 11, 40], max_new_tokens=24, temperature=0.9, top_p=0.95, seed=78)
    assert Engine(pair).generate([other_seed], mode="target_only")[0].tokens != reference
    top_seed = dataclasses.replace(request, seed=(1 << 64) - 1)  # past int64: TensorRT-LLM's UINT64
    engine = Engine(pair)
    assert engine.generate([top_seed])[0].tokens == engine.generate([*company, top_seed])[-1].tokens
