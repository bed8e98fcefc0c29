"""The embedded default pair: built by one call, loaded through from_pretrained."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from specbatch.decoding import Engine, GenerationRequest, build_tiny_pair, load_model_pair
from specbatch.decoding.tiny import TINY_ALPHA


@pytest.mark.slow
def test_tiny_pair_builds_once_and_loads_like_real_weights(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target_dir, draft_dir = build_tiny_pair(tmp_path / "tiny")
    stamp = (target_dir / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_pair(tmp_path / "tiny") == (target_dir, draft_dir)
    assert (target_dir / "model.safetensors").stat().st_mtime_ns == stamp

    record = json.loads((tmp_path / "tiny" / "controlled.json").read_text())
    assert abs(record["measured_alpha_greedy"] - TINY_ALPHA) < 0.05
    assert record["target_parameters"] > 2 * record["draft_parameters"]

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert tokenizer.convert_tokens_to_ids(special) is not None
        assert tokenizer.decode(tokenizer.encode(special)) == special
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert len(tokenizer) <= 4096

    pair = load_model_pair(str(target_dir), str(draft_dir))
    assert pair.hf_target.config.model_type == "qwen3"
    assert pair.max_context >= 4096
    # the target is the draft's layers plus more: the shared weights are identical
    torch.testing.assert_close(
        pair.hf_target.model.layers[0].mlp.up_proj.weight, pair.hf_draft.model.layers[0].mlp.up_proj.weight
    )
    engine = Engine(pair)
    request = GenerationRequest("Instruction: write a poem\nQuestion: \nGeneration:", max_new_tokens=64)
    speculative = engine.generate([request])[0]
    target_only = engine.generate([request], mode="target_only")[0]
    assert speculative.tokens == target_only.tokens
    assert speculative.total_draft_tokens > 0
