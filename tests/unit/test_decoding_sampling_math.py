"""Sampling arithmetic on plain tensors, no model: the temperature / top-k / top-p
filters against textbook ones, the sort-free filters the compiled path uses against
sorting ones, inverse-CDF draws, and the min(1, p/q) verification with its residual
and bonus token."""

from __future__ import annotations

import itertools

import pytest
import torch

from specbatch.decoding import counter_random
from specbatch.decoding.sampling import SamplingFeatures, SamplingTensors, probabilities, sample
from specbatch.decoding.speculative import verify
from specbatch.decoding.thresholds import top_k_keep, top_p_keep


def _reference_filter(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """Textbook temperature / top-k / top-p on one row of logits."""
    probs = torch.softmax(logits.double() / temperature, -1)
    if top_k:
        kth = torch.sort(logits.double() / temperature, descending=True).values[top_k - 1]
        probs = torch.where(logits.double() / temperature >= kth, probs, 0.0)
        probs = probs / probs.sum()
    if top_p < 1:
        order = torch.argsort(probs, descending=True).tolist()
        kept, mass = [], 0.0
        for token in order:
            if mass >= top_p:
                break
            kept.append(token)
            mass += float(probs[token])
        mask = torch.zeros_like(probs, dtype=torch.bool)
        mask[kept] = True
        probs = torch.where(mask, probs, 0.0)
        probs = probs / probs.sum()
    return probs


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"), [(1.0, 1.0, 0), (0.7, 0.8, 0), (1.3, 1.0, 3), (0.9, 0.6, 5)]
)
def test_probabilities_apply_temperature_top_k_and_top_p(
    temperature: float, top_p: float, top_k: int
) -> None:
    logits = torch.randn(3, 2, 50, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3
    params = SamplingTensors.from_lists([temperature] * 3, [top_p] * 3, [top_k] * 3, torch.device("cpu"))
    ours = probabilities(logits, params)
    for b, m in itertools.product(range(3), range(2)):
        torch.testing.assert_close(ours[b, m], _reference_filter(logits[b, m], temperature, top_p, top_k))


def test_greedy_rows_are_one_hot_at_the_argmax_beside_sampled_rows() -> None:
    logits = torch.randn(2, 1, 20, generator=torch.Generator().manual_seed(2))
    params = SamplingTensors.from_lists([0.0, 1.0], [0.5, 1.0], [3, 0], torch.device("cpu"))
    probs = probabilities(logits, params)
    assert probs[0, 0].tolist() == torch.nn.functional.one_hot(logits[0, 0].argmax(), 20).float().tolist()
    torch.testing.assert_close(probs[1, 0], torch.softmax(logits[1, 0], -1))


@pytest.mark.parametrize(
    ("model_dtype", "expected"),
    [
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_probabilities_are_float32_or_wider_whatever_the_model_dtype(
    model_dtype: torch.dtype, expected: torch.dtype
) -> None:
    """Acceptance min(1, p/q), the residual and the draws read these distributions: a
    bfloat16 softmax keeps 3 significant digits, enough to move p/q across a uniform.
    float64 stays float64 so the token-for-token proofs stay exact."""
    logits = (torch.randn(2, 3, 40, generator=torch.Generator().manual_seed(7)) * 3).to(model_dtype)
    params = SamplingTensors.from_lists([0.0, 1.0], [1.0, 1.0], [0, 0], torch.device("cpu"))
    for features in (None, SamplingFeatures(), SamplingFeatures(sampled=True)):
        assert probabilities(logits, params, features).dtype == expected
    probs = probabilities(logits, params)
    # the softmax itself ran in the wider type: far closer than bfloat16's 2**-8 rounding
    torch.testing.assert_close(probs[1], torch.softmax(logits[1].to(expected), -1), rtol=1e-6, atol=1e-7)
    assert probs[0].argmax(-1).tolist() == logits[0].argmax(-1).tolist()


def test_inverse_cdf_sampling_never_picks_a_zero_probability_token() -> None:
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]] * 5)
    picked = sample(probs, torch.tensor([0.0, 0.25, 0.4999, 0.5, 0.9999999], dtype=torch.float64))
    assert picked.tolist() == [1, 1, 1, 3, 3]


def test_verify_accepts_with_probability_min_one_p_over_q_and_resamples_the_residual() -> None:
    p = torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64)
    q = torch.tensor([0.5, 0.2, 0.3], dtype=torch.float64)
    grid = 10_000
    uniforms = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid
    draft_tokens = torch.zeros(grid, 1, dtype=torch.long)  # token 0: p/q = 0.2
    verdict = verify(
        draft_tokens,
        q.expand(grid, 1, 3),
        torch.stack([p, p]).expand(grid, 2, 3),
        uniforms.unsqueeze(1),
        uniforms.flip(0).unsqueeze(1).expand(grid, 2),
    )
    assert verdict.accepted.double().mean().item() == pytest.approx(0.2, abs=1e-3)
    rejected = verdict.accepted == 0
    residual = (p - q).clamp_min(0)
    residual = residual / residual.sum()  # [0, 1, 0]: only token 1 has p > q
    counts = torch.bincount(verdict.next_token[rejected], minlength=3).double() / int(rejected.sum())
    torch.testing.assert_close(counts, residual)


def test_verify_takes_the_bonus_token_from_the_last_target_distribution() -> None:
    p = torch.tensor([[0.2, 0.8, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    q = torch.tensor([[0.1, 0.9, 0.0]], dtype=torch.float64)
    verdict = verify(
        torch.tensor([[0]]), q.unsqueeze(0), p.unsqueeze(0), torch.tensor([[0.5]]), torch.tensor([[0.9, 0.3]])
    )
    assert verdict.accepted.tolist() == [1]
    assert verdict.next_token.tolist() == [2]


def _sorted_top_k(values: torch.Tensor, k: int) -> torch.Tensor:
    kth = values.sort(-1, descending=True).values[..., k - 1 : k]
    return values >= kth


def _sorted_top_p(probs: torch.Tensor, p: float) -> torch.Tensor:
    ordered, order = probs.sort(-1, descending=True)
    drop = (ordered.cumsum(-1) - ordered) >= p
    return ~torch.zeros_like(drop).scatter_(-1, order, drop)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_partial_selection_filters_equal_the_sorting_filters(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 3, 300, generator=generator, dtype=dtype) * 4
    logits[0, 0, :5] = -torch.inf
    logits[1, 0, 10:20] = 2.5  # ties at the threshold stay in
    for k, bound in ((1, 1), (2, 8), (7, 8), (15, 16), (300, 300)):
        keep = top_k_keep(logits, torch.full((4, 1, 1), k), bound)
        assert torch.equal(keep, _sorted_top_k(logits, k)), k
    probs = torch.softmax(torch.randn(4, 3, 300, generator=generator, dtype=dtype) * 4, -1)
    within_top_8 = torch.where(_sorted_top_k(probs, 8), probs, 0.0)
    within_top_8 = within_top_8 / within_top_8.sum(-1, keepdim=True)  # as after a top-k softmax
    for p in (0.05, 0.5, 0.9, 0.999):
        threshold = torch.full((4, 1, 1), p, dtype=dtype)
        assert torch.equal(top_p_keep(probs, threshold, 0), _sorted_top_p(probs, p)), p
        assert torch.equal(top_p_keep(within_top_8, threshold, 8), _sorted_top_p(within_top_8, p)), p


def test_a_64_bit_seed_keeps_all_its_bits_on_the_device() -> None:
    """TensorRT-LLM's random_seed is UINT64: past 2**63 it wraps to its two's complement,
    and the stream hashes both halves, so seeds that differ only in their high bits (or
    only in their low bits) draw apart."""
    assert counter_random.as_int64(5) == 5
    assert counter_random.as_int64((1 << 64) - 1) == -1
    assert counter_random.as_int64(1 << 63) == -(1 << 63)
    for outside in (1 << 64, -(1 << 63) - 1):
        with pytest.raises(ValueError, match="64 bits"):
            counter_random.as_int64(outside)
    seeds = [1, (1 << 32) + 1, (1 << 64) - 1, (1 << 64) - 2]
    tensor = torch.tensor([counter_random.as_int64(s) for s in seeds], dtype=torch.long)
    draws = counter_random.uniforms(tensor, torch.zeros(len(seeds), 1, dtype=torch.long), counter_random.NEXT)
    assert len(set(draws[:, 0].tolist())) == len(seeds)


def test_min_p_drops_the_tokens_under_its_share_of_the_likeliest_and_renormalises() -> None:
    shares = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    logits = torch.log(shares).expand(2, 1, 4)
    params = SamplingTensors.from_lists([1.0, 1.0], [1.0, 1.0], [0, 0], torch.device("cpu"), min_p=[0.4, 0.0])
    features = SamplingFeatures.of([1.0, 1.0], [1.0, 1.0], [0, 0], [False, False], 4, min_p=[0.4, 0.0])
    for probs in (probabilities(logits, params, features), probabilities(logits, params)):
        torch.testing.assert_close(probs[0, 0], torch.tensor([0.625, 0.375, 0.0, 0.0], dtype=torch.float64))
        torch.testing.assert_close(probs[1, 0], torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64))
    assert not SamplingFeatures.of([0.0], [1.0], [0], [False], 4, min_p=[0.4]).min_p, "greedy ignores it"
