"""Our Qwen3 forward over the Hugging Face weights must agree with the Hugging Face model."""

from __future__ import annotations

import torch
from pairs import make_pair, prompts

from specbatch.decoding.kv_blocks import dense_pool, layout_for
from specbatch.decoding.models import Qwen3Forward


def _hf_logits(hf_model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0]


def test_prefill_logits_match_hugging_face_for_a_padded_mixed_length_batch() -> None:
    pair = make_pair("unrelated", dtype=torch.float32)
    model: Qwen3Forward = pair.target
    rows = prompts(4, pair.vocab_size, seed=3, min_len=2, max_len=30)
    width = max(len(r) for r in rows)
    tokens = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    positions = torch.arange(width).expand(len(rows), width)
    real = positions < torch.tensor([len(r) for r in rows]).unsqueeze(1)
    pool, tables = dense_pool(len(rows), width + 4, block_size=8)
    store = model.new_store(pool.num_slots)
    with torch.no_grad():
        ours = model(tokens, positions, store, layout_for(tables, positions, real, pool), positions)
    for b, row in enumerate(rows):
        reference = _hf_logits(pair.hf_target, row)
        torch.testing.assert_close(ours[b, : len(row)], reference, atol=2e-4, rtol=1e-4)


def test_incremental_decoding_over_the_cache_matches_a_full_forward() -> None:
    pair = make_pair("unrelated", dtype=torch.float32)
    model: Qwen3Forward = pair.target
    rows = prompts(3, pair.vocab_size, seed=8, min_len=4, max_len=12)
    continuation = prompts(3, pair.vocab_size, seed=9, min_len=6, max_len=6)
    # blocks of 4 tokens handed out interleaved, so rows are not contiguous in the store
    pool, tables = dense_pool(3, 40, block_size=4)
    tables = [sorted(t, reverse=True) for t in tables]
    store = model.new_store(pool.num_slots)
    lengths = torch.tensor([len(r) for r in rows])
    width = int(lengths.max())

    def feed(tokens: torch.Tensor, positions: torch.Tensor, real: torch.Tensor, logits_at=None):
        layout = layout_for(tables, positions, real, pool)
        if logits_at is None:
            return model.fill(tokens, positions, store, layout)
        return model(tokens, positions, store, layout, logits_at)

    with torch.no_grad():
        prefill_positions = torch.arange(width).expand(3, width)
        feed(
            torch.tensor([r + [0] * (width - len(r)) for r in rows]),
            prefill_positions,
            prefill_positions < lengths.unsqueeze(1),
        )
        # feed two tokens, then (a rollback by one) re-feed from the second with three tokens
        first = torch.tensor([c[:2] for c in continuation])
        feed(first, lengths.unsqueeze(1) + torch.arange(2), torch.ones(3, 2, dtype=torch.bool))
        second = torch.tensor([c[1:4] for c in continuation])
        ours = feed(
            second,
            lengths.unsqueeze(1) + 1 + torch.arange(3),
            torch.ones(3, 3, dtype=torch.bool),
            torch.arange(3).expand(3, 3),
        )
    for b, row in enumerate(rows):
        reference = _hf_logits(pair.hf_target, row + continuation[b][:4])[len(row) + 1 :]
        torch.testing.assert_close(ours[b], reference, atol=2e-4, rtol=1e-4)


def test_kv_bytes_per_token_counts_keys_and_values_of_every_layer() -> None:
    pair = make_pair("controlled", dtype=torch.float32)
    config_t, config_d = pair.hf_target.config, pair.hf_draft.config
    expected = sum(
        2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4 for c in (config_t, config_d)
    )
    assert pair.kv_bytes_per_token == expected
