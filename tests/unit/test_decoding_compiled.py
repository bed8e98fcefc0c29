"""The GPU fast path's pieces on the CPU: step functions that compile as one graph
each (a graph break would mean a host synchronisation), sort-free top-k/top-p equal to
the sorting filters, attention backends that agree, and bucketed shapes."""

from __future__ import annotations

import pytest
import torch
from decoding_fixtures import make_pair

from specbatch.decoding import step_functions
from specbatch.decoding.attention import flex_attention_by_position, grouped_attention
from specbatch.decoding.buckets import Shapes
from specbatch.decoding.compiled import StepFunctions
from specbatch.decoding.kv_blocks import dense_pool, slot_table, write_slots
from specbatch.decoding.sampling import SamplingFeatures, SamplingParams
from specbatch.decoding.step_functions import Draws, Feed, Network
from specbatch.decoding.thresholds import top_k_keep, top_p_keep

ALL = SamplingFeatures(sampled=True, top_k_bound=32, top_p=True, top_p_candidates=0, coupled=True)


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


def test_grouped_and_flex_attention_agree_without_repeating_heads() -> None:
    generator = torch.Generator().manual_seed(4)
    q = torch.randn(3, 4, 2, 16, generator=generator)
    keys = torch.randn(3, 2, 64, 16, generator=generator)
    values = torch.randn(3, 2, 64, 16, generator=generator)
    positions = torch.tensor([[5, 6], [30, 31], [0, 63]])
    mask = torch.arange(64).view(1, 1, 1, 64) <= positions.view(3, 1, 2, 1)
    reference = torch.nn.functional.scaled_dot_product_attention(
        q, keys, values, attn_mask=mask, enable_gqa=True
    )
    torch.testing.assert_close(grouped_attention(q, keys, values, positions), reference)
    flex = torch.compile(flex_attention_by_position, fullgraph=True, dynamic=False)
    torch.testing.assert_close(flex(q, keys, values, positions), reference)


def test_shapes_pad_to_buckets_only_when_static() -> None:
    static, exact = Shapes(static=True), Shapes(static=False)
    assert [static.batch(n) for n in (1, 3, 5, 9, 33, 64, 65, 130)] == [1, 4, 8, 16, 64, 64, 128, 192]
    assert [static.width(n) for n in (1, 2, 3, 5, 200)] == [1, 2, 4, 8, 256]
    assert [static.span(n) for n in (1, 64, 65, 1000)] == [64, 64, 128, 1024]
    assert static.lookahead(3) == 8
    assert (exact.batch(5), exact.width(3), exact.span(65), exact.lookahead(3)) == (5, 3, 65, 3)


def _inputs(dtype: torch.dtype):
    """A padded batch of three rows (greedy, unseeded top-k/top-p, seeded) plus one
    padding row, each with a few cached tokens."""
    pair = make_pair("controlled", dtype=dtype)
    pool, tables = dense_pool(3, 64, block_size=16)
    store = pair.target.new_store(pool.num_slots)
    net = Network(pair.target.weights, pair.target.geometry, store, pair.vocab_size, grouped_attention)
    read = slot_table([*tables, []], 64, pool, torch.device("cpu"))
    generator = torch.Generator().manual_seed(5)
    tokens = torch.randint(3, pair.vocab_size, (4, 9), generator=generator)
    positions = torch.tensor([[10], [20], [30], [0]]) + torch.arange(9)
    real = torch.tensor([True, True, True, False]).unsqueeze(1).expand(4, 9)
    feed = Feed(tokens, positions, write_slots(read, positions, real, pool), read)
    params = SamplingParams.from_lists(
        [0.0, 0.9, 1.1, 0.0], [1.0, 0.8, 0.95, 1.0], [0, 20, 0, 0], torch.device("cpu")
    )
    draws = Draws(params, torch.tensor([0, 1, 2, 0]), torch.tensor([False, False, True, False]))
    return net, feed, draws, positions[:, 0] + 1


def test_step_functions_compile_as_one_graph_each_and_match_eager() -> None:
    net, feed, draws, seq_len = _inputs(torch.float32)
    compiled = StepFunctions("default", torch.device("cpu"))  # fullgraph=True: a graph break raises
    first = Feed(feed.tokens[:, :1], feed.positions[:, :1], feed.write_slots[:, :1], feed.read_slots)
    compiled.prefill_chunk(net, first)
    index = torch.zeros(4, 1, dtype=torch.long)
    eager_token, eager_probs = step_functions.sample_step(net, first, index, draws, seq_len, 1, ALL)
    token, probs = compiled.sample_step(net, first, index, draws, seq_len, 1, ALL)
    assert token.tolist() == eager_token.tolist()
    torch.testing.assert_close(probs, eager_probs)
    drafts = feed.tokens[:, 1:]
    draft_probs = torch.softmax(torch.randn(4, 8, net.vocab, generator=torch.Generator().manual_seed(6)), -1)
    lookahead = torch.tensor([8, 3, 5, 1])
    args = (net, feed, draws, seq_len, drafts, draft_probs, lookahead, ALL)
    eager = step_functions.verify_step(*args)
    result = compiled.verify_step(*args)
    assert [t.tolist() for t in result] == [t.tolist() for t in eager]
    assert all(n <= k for n, k in zip(result[0].tolist(), lookahead.tolist(), strict=True))
