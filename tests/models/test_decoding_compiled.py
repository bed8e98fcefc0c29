"""The GPU fast path's pieces on the CPU: step functions that compile as one graph
each (a graph break would mean a host synchronisation) and attention backends that
agree. The sort-free top-k/top-p filters and the bucketed shapes need no model and are
tested in tests/unit."""

from __future__ import annotations

import torch
from pairs import make_pair

from specbatch.decoding import step_functions
from specbatch.decoding.attention import flex_attention_by_position, grouped_attention
from specbatch.decoding.compiled import StepFunctions
from specbatch.decoding.kv_blocks import dense_pool, slot_table, write_slots
from specbatch.decoding.sampling import SamplingFeatures, SamplingTensors
from specbatch.decoding.step_functions import Draws, Feed, Network

ALL = SamplingFeatures(sampled=True, top_k_bound=32, top_p=True, top_p_candidates=0, coupled=True)


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
    params = SamplingTensors.from_lists(
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


def test_a_bfloat16_model_hands_out_float32_distributions() -> None:
    """The draft's q that verification divides by, and the target's p, are float32 even
    when the model runs in bfloat16 (the GPU default): the step functions upcast the
    logits before softmax, so acceptance never reads a bfloat16-rounded probability."""
    net, feed, draws, seq_len = _inputs(torch.bfloat16)
    first = Feed(feed.tokens[:, :1], feed.positions[:, :1], feed.write_slots[:, :1], feed.read_slots)
    step_functions.prefill_chunk(net, first)
    index = torch.zeros(4, 1, dtype=torch.long)
    _, probs = step_functions.sample_step(net, first, index, draws, seq_len, 1, ALL)
    assert net.weights.lm_head.dtype == torch.bfloat16
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(4))
