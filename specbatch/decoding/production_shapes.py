"""Random-weight checkpoints with the production pair's shapes, small enough for a CPU.

Why: the tiny pair exercises none of what the published checkpoints bring. Qwen3-0.6B
ties its embeddings (its files hold no lm_head tensor), both checkpoints are sharded
safetensors behind a ``model.safetensors.index.json``, the embedding has 151,936 rows
for a tokenizer of 151,669 ids, heads are 128 wide with 16/8 (0.6B) and 32/8 (8B)
query/KV heads, and a KV budget turns into blocks only at those sizes. This pair has
all of it and loads through the same ``from_pretrained`` path as real weights: the
draft is Qwen3-0.6B's exact configuration, the target Qwen3-8B's with 4 of its 36
layers (the whole 8B is 16 GB of bf16: no room on a 24 GB machine beside the rest).

Weights are seeded and scaled as the tiny pair's (:func:`initialise_weights`), saved
in bfloat16 as the published checkpoints are. Draft and target are independent, so
their acceptance is near zero: the pair tests shapes and loading, not speed-ups.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

import torch

from specbatch.decoding.tiny import initialise_weights

logger = logging.getLogger(__name__)

SHARD_SIZE = "400MB"  # several shards per model, as the hub's checkpoints come
TARGET_LAYERS = 4
RECORD = "production_shapes.json"

# The published config.json of each model (Qwen/Qwen3-0.6B, Qwen/Qwen3-8B), less what
# transformers fills in by default.
_COMMON = {
    "vocab_size": 151_936,
    "max_position_embeddings": 40_960,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "head_dim": 128,
    "num_key_value_heads": 8,
    "attention_bias": False,
    "hidden_act": "silu",
    "bos_token_id": 151_643,
    "eos_token_id": 151_645,
}
QWEN3_0_6B = {
    **_COMMON,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "tie_word_embeddings": True,
}
QWEN3_8B = {
    **_COMMON,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "tie_word_embeddings": False,
}
# Qwen3's generation_config.json: either end-of-text token stops generation.
_GENERATION = {"bos_token_id": 151_643, "eos_token_id": [151_645, 151_643], "pad_token_id": 151_643}


def qwen3_config(shape: dict, layers: int | None = None) -> object:
    """A ``Qwen3Config`` of ``shape`` (:data:`QWEN3_0_6B` or :data:`QWEN3_8B`), with
    ``layers`` decoder layers instead of the published count when given."""
    from transformers import Qwen3Config

    if layers is not None:
        shape = {**shape, "num_hidden_layers": layers}
    return Qwen3Config(**shape, max_window_layers=shape["num_hidden_layers"], dtype="bfloat16")


def parameter_count(config: object) -> int:
    """Parameters of a Qwen3ForCausalLM of ``config``, counted without allocating it
    (a tied lm_head counts once, as the checkpoint stores it)."""
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    return sum(p.numel() for p in model.parameters())


def _is_built(out_dir: Path) -> bool:
    return (out_dir / RECORD).exists() and all(
        (out_dir / name / "model.safetensors.index.json").exists() for name in ("target", "draft")
    )


def _save_model(config: object, seed: int, out_dir: Path, tokenizer_dir: Path) -> dict:
    """Build, initialise and save one model (sharded, bf16) with the tokenizer; what was saved."""
    from transformers import GenerationConfig, Qwen3ForCausalLM

    model = Qwen3ForCausalLM._from_config(config, dtype=torch.bfloat16)
    initialise_weights(model, torch.Generator().manual_seed(seed))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    model.generation_config = GenerationConfig(**_GENERATION)
    model.save_pretrained(out_dir, max_shard_size=SHARD_SIZE)
    for source in tokenizer_dir.iterdir():
        shutil.copy(source, out_dir / source.name)
    stored = json.loads((out_dir / "model.safetensors.index.json").read_text())["weight_map"]
    if config.tie_word_embeddings and "lm_head.weight" in stored:
        raise RuntimeError(f"{out_dir}: a tied model saved an lm_head tensor")
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "layers": config.num_hidden_layers,
        "tied_embeddings": config.tie_word_embeddings,
        "shards": len(set(stored.values())),
        "bytes_on_disk": sum(f.stat().st_size for f in out_dir.glob("*.safetensors")),
    }


def build_production_shapes(out_dir: Path, force: bool = False, seed: int = 0) -> tuple[Path, Path]:
    """Build (or reuse) the pair in ``out_dir``/target and ``out_dir``/draft; one model in
    memory at a time (the target's bf16 weights are about 4 GB)."""
    from specbatch.decoding.tokenizer_build import build_qwen3_sized_tokenizer

    out_dir = Path(out_dir)
    target_dir, draft_dir = out_dir / "target", out_dir / "draft"
    if _is_built(out_dir) and not force:
        logger.info("%s already built; skipping (use force to rebuild)", out_dir)
        return target_dir, draft_dir
    (out_dir / RECORD).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        build_qwen3_sized_tokenizer(Path(scratch))
        record = {
            "draft": _save_model(qwen3_config(QWEN3_0_6B), seed, draft_dir, Path(scratch)),
            "target": _save_model(qwen3_config(QWEN3_8B, TARGET_LAYERS), seed + 1, target_dir, Path(scratch)),
        }
    record.update(seed=seed, shard_size=SHARD_SIZE, dtype="bfloat16")
    (out_dir / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    logger.info("built %s: %s", out_dir, record)
    return target_dir, draft_dir
