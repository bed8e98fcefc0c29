"""The production pair's shapes through the real loader, decoding in bfloat16 on CPU.

What the tiny pair never exercises: Qwen3-0.6B's tied embeddings (no lm_head tensor in
its files), sharded safetensors behind an index, 151,936 embedding rows for a
tokenizer of 151,669 ids, 128-wide heads with 16/8 and 32/8 query/KV heads, and the
KV pool a budget gives at those sizes. The pair (random weights, a 4-layer Qwen3-8B) is
about 5 GB and takes a minute to build, so the tests that load it run only when asked:
``make test-production-shapes``; the tokenizer's test always runs (a few seconds).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from pairs import attract_to_padding
from transformers import AutoTokenizer

from specbatch.decoding import Engine, GenerationRequest, ModelPair, load_model_pair
from specbatch.decoding.kv_blocks import dense_pool, layout_for
from specbatch.decoding.tokenizer_build import build_qwen3_sized_tokenizer
from specbatch.server.launcher import PRODUCTION_SHAPES_DIR, ensure_production_shapes

ROOT = Path(__file__).resolve().parents[2]
QWEN3_TOKENIZER_IDS = 151_669
EMBEDDING_ROWS = 151_936

PROMPTS = (
    "<|im_start|>user\nInstruction: Name three colours.\nQuestion: \nGeneration:<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "Question:\nWhich nerve innervates the diaphragm?\n\nChoices:\nA. vagus\nB. phrenic\nC. radial\nD. ulnar",
)


@pytest.fixture(scope="module")
def models_dir() -> Path:
    """The built pair; a test that needs it is skipped unless asked for."""
    if os.environ.get("SPECBATCH_PRODUCTION_SHAPES") != "1":
        pytest.skip("loads 5 GB of production-shaped weights: make test-production-shapes")
    ensure_production_shapes(ROOT)
    return ROOT / PRODUCTION_SHAPES_DIR


@pytest.fixture(scope="module")
def production_pair(models_dir: Path) -> ModelPair:
    """The pair as the server loads it (bf16, CPU), with the target's padding rows made the
    likeliest logits by far: a padded id chosen anywhere would show in the outputs."""
    pair = load_model_pair(str(models_dir / "target"), str(models_dir / "draft"), dtype="bfloat16")
    pair.eos_token_ids.clear()  # random weights: run every row to its budget
    with torch.no_grad():
        attract_to_padding(pair.hf_target.lm_head.weight, len(pair.tokenizer))
    return pair


def test_the_tokenizer_has_qwen3s_size_and_added_token_ids(tmp_path: Path) -> None:
    build_qwen3_sized_tokenizer(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == QWEN3_TOKENIZER_IDS < EMBEDDING_ROWS
    named = {"<|endoftext|>": 151_643, "<|im_start|>": 151_644, "<|im_end|>": 151_645, "<think>": 151_667}
    assert {token: tokenizer.convert_tokens_to_ids(token) for token in named} == named
    assert tokenizer.convert_ids_to_tokens(QWEN3_TOKENIZER_IDS - 1) == "</think>"
    text = PROMPTS[1] + " héllo 日本"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.decode([151_667, 151_645], skip_special_tokens=True) == "<think>", "think is not special"
    assert "<|im_start|>assistant\n" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )


@pytest.mark.slow
def test_the_checkpoints_are_laid_out_like_the_published_ones(models_dir: Path) -> None:
    for name, tied in (("target", False), ("draft", True)):
        index = json.loads((models_dir / name / "model.safetensors.index.json").read_text())
        weight_map = index["weight_map"]
        assert json.loads((models_dir / name / "config.json").read_text())["vocab_size"] == EMBEDDING_ROWS
        assert len(set(weight_map.values())) > 1, f"{name}: sharded"
        assert ("lm_head.weight" in weight_map) is not tied, f"{name}: lm_head only when untied"


@pytest.mark.slow
def test_the_pair_loads_with_the_production_shapes(production_pair: ModelPair) -> None:
    pair = production_pair
    assert len(pair.tokenizer) == QWEN3_TOKENIZER_IDS and pair.vocab_size == QWEN3_TOKENIZER_IDS
    assert pair.target.weights.lm_head.shape[0] == EMBEDDING_ROWS
    assert pair.draft.weights.lm_head.data_ptr() == pair.draft.weights.embed.data_ptr(), "tied"
    assert pair.target.dtype == pair.draft.dtype == torch.bfloat16
    shapes = [(m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim) for m in (pair.target, pair.draft)]
    assert shapes == [(4, 32, 8, 128), (28, 16, 8, 128)]
    assert pair.max_context == 40_960
    # 2 (K and V) x layers x 8 KV heads x 128 x 2 bytes: 16 KiB (target) + 112 KiB (draft)
    assert pair.kv_bytes_per_token == 128 << 10
    engine = Engine(pair, lookahead=3, kv_memory_budget_bytes=1 << 29, block_size=16)
    assert engine.pool.num_blocks == 256


@pytest.mark.slow
def test_logits_are_finite_in_bfloat16(production_pair: ModelPair) -> None:
    ids = production_pair.tokenizer.encode(PROMPTS[1])
    tokens = torch.tensor([ids])
    positions = torch.arange(len(ids)).unsqueeze(0)
    for model in (production_pair.target, production_pair.draft):
        pool, tables = dense_pool(1, len(ids))
        layout = layout_for(tables, positions, torch.ones_like(tokens, dtype=torch.bool), pool)
        logits = model(tokens, positions, model.new_store(pool.num_slots), layout, positions)
        assert torch.isfinite(logits.float()).all()


@pytest.mark.slow
def test_greedy_speculative_equals_target_only_and_never_a_padded_id(production_pair: ModelPair) -> None:
    requests = [GenerationRequest(prompt, max_new_tokens=12, temperature=0.0) for prompt in PROMPTS]
    engine = Engine(production_pair, lookahead=3, kv_memory_budget_bytes=1 << 28, max_rows=4)
    target_only = engine.generate(requests, mode="target_only")
    speculative = engine.generate(requests, mode="speculative")
    for plain, drafted in zip(target_only, speculative, strict=True):
        assert all(t < QWEN3_TOKENIZER_IDS for t in plain.tokens + drafted.tokens)
        assert drafted.total_draft_tokens > 0
        assert drafted.tokens == plain.tokens
