"""Our Qwen3 forward over the Hugging Face weights must agree with the Hugging Face model."""

from __future__ import annotations

import torch
from decoding_fixtures import make_pair, prompts

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
    cache = model.new_cache(len(rows), width + 4)
    with torch.no_grad():
        ours = model(tokens, positions, cache, positions)
    for b, row in enumerate(rows):
        reference = _hf_logits(pair.hf_target, row)
        torch.testing.assert_close(ours[b, : len(row)], reference, atol=2e-4, rtol=1e-4)


def test_incremental_decoding_over_the_cache_matches_a_full_forward() -> None:
    pair = make_pair("unrelated", dtype=torch.float32)
    model: Qwen3Forward = pair.target
    rows = prompts(3, pair.vocab_size, seed=8, min_len=4, max_len=12)
    continuation = prompts(3, pair.vocab_size, seed=9, min_len=6, max_len=6)
    cache = model.new_cache(3, 40)
    lengths = torch.tensor([len(r) for r in rows])
    width = int(lengths.max())
    with torch.no_grad():
        model.fill(
            torch.tensor([r + [0] * (width - len(r)) for r in rows]),
            torch.arange(width).expand(3, width),
            cache,
        )
        # feed two tokens, then (a rollback by one) re-feed from the second with three tokens
        first = torch.tensor([c[:2] for c in continuation])
        model.fill(first, lengths.unsqueeze(1) + torch.arange(2), cache)
        second = torch.tensor([c[1:4] for c in continuation])
        ours = model(second, lengths.unsqueeze(1) + 1 + torch.arange(3), cache, torch.arange(3).expand(3, 3))
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
