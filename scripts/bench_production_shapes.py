"""The production pair's shapes on this CPU, and what they mean for an 80 GB GPU.

Loads the production-shaped random pair (`specbatch build-models --production-shapes`:
Qwen3-0.6B's exact shapes and a 4-layer Qwen3-8B, sharded bf16) through the server's
loader, sizes the KV pool from the cpu_production_shapes config's kv_memory_budget_gb
with the engine's own rule, and measures load time, memory (RSS and tensor bytes) and
the time per token of target-only and speculative greedy decoding (and the one-time
pass-cost calibration a server's first step runs). Then, from the published
configurations (36-layer Qwen3-8B + Qwen3-0.6B in bf16) and the same sizing code, what
an 80 GiB GPU holds after the weights: KV blocks, tokens, rows.

    .venv/bin/python scripts/bench_production_shapes.py --out results/bench_production_shapes.json
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import threading
import time
from pathlib import Path

import psutil
import torch

from specbatch.decoding import Engine, GenerationRequest, load_model_pair
from specbatch.decoding.cpu_threads import threads_for_the_engine_loop
from specbatch.decoding.kv_blocks import blocks_in_budget
from specbatch.decoding.models import cache_bytes_per_token
from specbatch.decoding.production_shapes import QWEN3_0_6B, QWEN3_8B, parameter_count, qwen3_config
from specbatch.server.launcher import PRODUCTION_SHAPES_DIR, ensure_production_shapes

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30
PROMPT = "Instruction: Describe the phrenic nerve and what it supplies.\nQuestion: \nGeneration:"


def config_parameter(config_file: Path, key: str) -> str:
    """One `parameters { key: ... }` string value of a model config (pbtxt)."""
    pattern = rf'key:\s*"{re.escape(key)}"\s*value:\s*{{\s*string_value:\s*"([^"]*)"'
    match = re.search(pattern, config_file.read_text())
    if match is None:
        raise KeyError(f"{config_file}: no parameter {key!r}")
    return match.group(1)


def rss_gib() -> float:
    return psutil.Process().memory_info().rss / GIB


def tensor_gib(tensors: list[torch.Tensor]) -> float:
    unique = {t.data_ptr(): t.numel() * t.element_size() for t in tensors}
    return sum(unique.values()) / GIB


def seconds_per_token(engine: Engine, mode: str, rows: int, new_tokens: int) -> dict:
    """Greedy decoding of ``rows`` copies of the prompt: wall time per generated token."""
    requests = [GenerationRequest(PROMPT, max_new_tokens=new_tokens, temperature=0.0) for _ in range(rows)]
    started = time.perf_counter()
    results = engine.generate(requests, mode=mode)
    seconds = time.perf_counter() - started
    tokens = sum(r.num_output_tokens for r in results)
    drafted = sum(r.total_draft_tokens for r in results)
    accepted = sum(r.total_accepted_draft_tokens for r in results)
    return {
        "mode": mode,
        "rows": rows,
        "new_tokens": tokens,
        "seconds": round(seconds, 2),
        "ms_per_token": round(1000 * seconds / tokens, 1),
        "ms_per_step": round(1000 * seconds / new_tokens, 1),
        "acceptance": round(accepted / drafted, 3) if drafted else None,
    }


def gpu_estimate(gpu_gib: float, reserve_gib: float, block_size: int, production_budget_gib: float) -> dict:
    """What the full 36-layer Qwen3-8B + Qwen3-0.6B in bf16 leave for KV on one GPU,
    sized by the engine's rule (cache bytes per token of each model, blocks in a budget)."""
    target, draft = qwen3_config(QWEN3_8B), qwen3_config(QWEN3_0_6B)
    parameters = {"target": parameter_count(target), "draft": parameter_count(draft)}
    weights = 2 * sum(parameters.values())  # bf16
    per_token = cache_bytes_per_token(target, torch.bfloat16) + cache_bytes_per_token(draft, torch.bfloat16)
    free = int((gpu_gib - reserve_gib) * GIB) - weights
    blocks = blocks_in_budget(free, block_size, per_token)
    configured = blocks_in_budget(int(production_budget_gib * GIB), block_size, per_token)
    return {
        "gpu_gib": gpu_gib,
        "reserve_gib_for_activations_and_runtime": reserve_gib,
        "parameters": parameters,
        "weights_gib": round(weights / GIB, 2),
        "kv_bytes_per_token": per_token,
        "kv_gib_after_weights": round(free / GIB, 2),
        "kv_blocks_after_weights": blocks,
        "kv_tokens_after_weights": blocks * block_size,
        "rows_of_4096_tokens": blocks * block_size // 4096,
        "rows_of_40960_tokens": blocks * block_size // 40960,
        "production_config_budget_gib": production_budget_gib,
        "production_config_kv_blocks": configured,
        "production_config_kv_tokens": configured * block_size,
    }


def calibrate(engine: Engine) -> None:
    with torch.inference_mode():
        engine.runner.calibrate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=ROOT / PRODUCTION_SHAPES_DIR)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--gpu-gib", type=float, default=80.0)
    parser.add_argument("--reserve-gib", type=float, default=6.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_production_shapes.json")
    args = parser.parse_args()
    if args.models == ROOT / PRODUCTION_SHAPES_DIR:
        ensure_production_shapes(ROOT)
    cpu_config = ROOT / "model_repository" / "qwen3_specdec" / "configs" / "cpu_production_shapes.pbtxt"
    gpu_config = ROOT / "model_repository" / "qwen3_specdec" / "config.pbtxt"
    budget_gib = float(config_parameter(cpu_config, "kv_memory_budget_gb"))
    block_size = int(config_parameter(cpu_config, "kv_block_size"))

    rss_before = rss_gib()
    started = time.perf_counter()
    with threads_for_the_engine_loop(args.threads):  # as a CPU instance loads
        pair = load_model_pair(str(args.models / "target"), str(args.models / "draft"), dtype="bfloat16")
        load_s = time.perf_counter() - started
        rss_loaded = rss_gib()
        pair.eos_token_ids.clear()  # random weights: every row runs to its budget
        budget_bytes = int(budget_gib * GIB)
        engine = Engine(pair, lookahead=3, kv_memory_budget_bytes=budget_bytes, block_size=block_size)
    kv_tensors = [t for store in engine.runner.stores.values() for t in store.keys + store.values]
    weights = [*pair.hf_target.parameters(), *pair.hf_draft.parameters()]
    production_budget_gib = float(config_parameter(gpu_config, "kv_memory_budget_gb"))
    started = time.perf_counter()
    # what the goodput policy's first step pays in a server, on a thread of its own as the
    # engine's loop runs it (the main thread never computes on more than one thread)
    calibration = threading.Thread(target=calibrate, args=(engine,))
    calibration.start()
    calibration.join()
    calibration_s = time.perf_counter() - started
    timings = [
        seconds_per_token(engine, "target_only", 1, args.new_tokens),
        seconds_per_token(engine, "speculative", 1, args.new_tokens),
        seconds_per_token(engine, "target_only", 4, args.new_tokens),
    ]
    report = {
        "machine": {"cpu_threads": torch.get_num_threads(), "torch": torch.__version__},
        "load_seconds": round(load_s, 1),
        "parameters": {
            "target": sum(p.numel() for p in pair.hf_target.parameters()),
            "draft": sum(p.numel() for p in pair.hf_draft.parameters()),
        },
        "vocab": {"embedding_rows": pair.target.weights.lm_head.shape[0], "tokenizer_ids": pair.vocab_size},
        "kv_pool": {
            "config": str(cpu_config.relative_to(ROOT)),
            "budget_gib": budget_gib,
            "block_size": block_size,
            "bytes_per_token": {
                "target": pair.target.kv_bytes_per_token,
                "draft": pair.draft.kv_bytes_per_token,
            },
            "blocks": engine.pool.num_blocks,
            "kv_tensor_gib_allocated": round(tensor_gib(kv_tensors), 3),  # the blocks + scratch
        },
        "memory_gib": {
            "weight_tensors": round(tensor_gib(weights), 2),
            "rss_before_load": round(rss_before, 2),
            "rss_after_load": round(rss_loaded, 2),
            "rss_after_decoding": round(rss_gib(), 2),
            "peak_rss": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20), 2),
        },
        "first_step_cost_calibration_seconds": round(calibration_s, 1),
        "decoding": timings,
        "gpu_estimate": gpu_estimate(args.gpu_gib, args.reserve_gib, block_size, production_budget_gib),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
