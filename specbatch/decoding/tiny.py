"""Deterministic tiny Qwen3 pairs for the embedded default, tests and benchmarks.

A controlled pair makes acceptance a dial: the draft is a small random Qwen3; the
target is the draft's layers (same embeddings, final norm and lm_head) followed by
extra layers whose residual contribution (o_proj and down_proj) is scaled by ε. At
ε = 0 the target computes exactly the draft's function (acceptance 1); larger ε
moves it away. The target costs several times the draft, like 8B vs 0.6B. ε is
calibrated by bisection on the measured greedy acceptance with lookahead 1, where
the acceptance rate is exactly the per-token agreement α; the result is recorded in
``controlled.json`` beside the models. Everything is seeded: a rebuild is identical.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specbatch.acceptance import acceptance_rate

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PairSpec:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    draft_layers: int
    extra_target_layers: int
    seed: int = 0
    max_position_embeddings: int = 4096


TINY_SPEC = PairSpec(
    hidden_size=256,
    intermediate_size=768,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    draft_layers=2,
    extra_target_layers=4,
)
BENCH_SPEC = PairSpec(
    hidden_size=512,
    intermediate_size=1536,
    num_heads=8,
    num_kv_heads=4,
    head_dim=64,
    draft_layers=2,
    extra_target_layers=10,
)
TINY_ALPHA = 0.7
CONTROLLED_ALPHAS = {"a50": 0.5, "a70": 0.7, "a90": 0.9}


def _config(spec: PairSpec, vocab_size: int, layers: int, tokenizer: object) -> object:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )


def initialise_weights(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Weights scaled so activations keep unit size and logits are peaked (std ≈ 4),
    which makes greedy outputs depend on context the way a trained model's do. With
    tied embeddings the lm_head is the unit-size embedding, so the final norm scales
    the last hidden state down instead (logits keep std ≈ 4, finite in bfloat16)."""
    hidden = model.config.hidden_size
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
        elif "embed_tokens" in name:
            param.data.normal_(0.0, 1.0, generator=generator)
        elif "lm_head" in name:
            param.data.normal_(0.0, 4.0 / math.sqrt(hidden), generator=generator)
        else:
            param.data.normal_(0.0, 1.0 / math.sqrt(param.shape[1]), generator=generator)
    if model.config.tie_word_embeddings:
        model.model.norm.weight.data.fill_(4.0 / math.sqrt(hidden))


def random_qwen3(
    spec: PairSpec,
    vocab_size: int,
    layers: int,
    tokenizer: object,
    seed: int,
    dtype: torch.dtype = torch.float32,
) -> torch.nn.Module:
    """A seeded random Qwen3ForCausalLM."""
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM(_config(spec, vocab_size, layers, tokenizer))
    initialise_weights(model, torch.Generator().manual_seed(seed))
    return model.to(dtype).eval()


def extended_target(
    draft: torch.nn.Module, spec: PairSpec, tokenizer: object, epsilon: float, seed: int
) -> torch.nn.Module:
    """The draft's layers plus ``spec.extra_target_layers`` layers scaled by ε."""
    vocab_size = draft.config.vocab_size
    target = random_qwen3(
        spec, vocab_size, spec.draft_layers + spec.extra_target_layers, tokenizer, seed, draft.dtype
    )
    state = {k: v for k, v in draft.state_dict().items() if k in target.state_dict()}
    target.load_state_dict(state, strict=False)
    set_epsilon(target, spec.draft_layers, epsilon, _unscaled_outputs(target, spec.draft_layers))
    return target


def _unscaled_outputs(target: torch.nn.Module, first_extra: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [
        (layer.self_attn.o_proj.weight.detach().clone(), layer.mlp.down_proj.weight.detach().clone())
        for layer in target.model.layers[first_extra:]
    ]


def set_epsilon(
    target: torch.nn.Module,
    first_extra: int,
    epsilon: float,
    unscaled: list[tuple[torch.Tensor, torch.Tensor]],
) -> None:
    """Scale the extra layers' residual outputs by ε, in place."""
    for layer, (o_proj, down_proj) in zip(target.model.layers[first_extra:], unscaled, strict=True):
        layer.self_attn.o_proj.weight.data.copy_(o_proj * epsilon)
        layer.mlp.down_proj.weight.data.copy_(down_proj * epsilon)


def calibration_prompts(tokenizer: object, count: int = 8) -> list[list[int]]:
    from specbatch.decoding.tokenizer_build import corpus

    lines = corpus(lines=count, seed=1234)
    return [tokenizer.encode(line, add_special_tokens=False)[:48] for line in lines]


def measure_acceptance(
    pair: object, prompts: list[list[int]], temperature: float, new_tokens: int = 48, seed: int = 0
) -> float:
    """Acceptance with lookahead 1: the per-token acceptance probability α itself."""
    from specbatch.decoding.engine import Engine
    from specbatch.decoding.requests import GenerationRequest

    engine = Engine(pair, lookahead=1)
    engine.pair.eos_token_ids.clear()  # calibrate over full-length outputs
    requests = [
        GenerationRequest(prompt=p, max_new_tokens=new_tokens, temperature=temperature, seed=seed + i)
        for i, p in enumerate(prompts)
    ]
    results = engine.generate(requests, mode="speculative")
    drafted = sum(r.total_draft_tokens for r in results)
    return acceptance_rate(drafted, sum(r.total_accepted_draft_tokens for r in results))


def calibrate_epsilon(
    draft: torch.nn.Module, target: torch.nn.Module, spec: PairSpec, tokenizer: object, alpha: float
) -> tuple[float, float]:
    """Bisect log ε until greedy acceptance is close to ``alpha``; returns (ε, measured α)."""
    from specbatch.decoding.pair import pair_from_models

    prompts = calibration_prompts(tokenizer)
    unscaled = _unscaled_outputs(target, spec.draft_layers)
    pair = pair_from_models(target, draft, tokenizer)
    low, high = math.log(1e-3), math.log(10.0)
    best = (1.0, 0.0, math.inf)
    for _ in range(12):
        epsilon = math.exp((low + high) / 2)
        set_epsilon(target, spec.draft_layers, epsilon, unscaled)
        measured = measure_acceptance(pair, prompts, temperature=0.0)
        logger.info("calibration: epsilon=%.4f acceptance=%.3f (want %.2f)", epsilon, measured, alpha)
        if abs(measured - alpha) < best[2]:
            best = (epsilon, measured, abs(measured - alpha))
        if abs(measured - alpha) < 0.02:
            break
        if measured > alpha:
            low = math.log(epsilon)
        else:
            high = math.log(epsilon)
    set_epsilon(target, spec.draft_layers, best[0], unscaled)
    return best[0], best[1]


def _pair_is_built(out_dir: Path) -> bool:
    return (
        all((out_dir / name / "config.json").exists() for name in ("target", "draft"))
        and (out_dir / "controlled.json").exists()
    )


def build_controlled_pair(
    out_dir: Path, spec: PairSpec, alpha: float, force: bool = False
) -> tuple[Path, Path]:
    """Build (or reuse) a controlled pair in ``out_dir``/target and ``out_dir``/draft."""
    from transformers import AutoTokenizer

    from specbatch.decoding.pair import pair_from_models
    from specbatch.decoding.tokenizer_build import build_tokenizer

    out_dir = Path(out_dir)
    target_dir, draft_dir = out_dir / "target", out_dir / "draft"
    if _pair_is_built(out_dir) and not force:
        logger.info("%s already built; skipping (use force to rebuild)", out_dir)
        for directory in (target_dir, draft_dir):
            refresh_chat_template(directory)
        return target_dir, draft_dir
    with tempfile.TemporaryDirectory() as scratch:
        build_tokenizer(Path(scratch))
        tokenizer = AutoTokenizer.from_pretrained(scratch)
    torch.manual_seed(spec.seed)
    draft = random_qwen3(spec, len(tokenizer), spec.draft_layers, tokenizer, seed=spec.seed)
    target = extended_target(draft, spec, tokenizer, epsilon=1.0, seed=spec.seed + 1)
    epsilon, greedy_alpha = calibrate_epsilon(draft, target, spec, tokenizer, alpha)
    sampled_alpha = measure_acceptance(
        pair_from_models(target, draft, tokenizer), calibration_prompts(tokenizer), temperature=0.7
    )
    record = {
        "requested_alpha": alpha,
        "epsilon": epsilon,
        "measured_alpha_greedy": round(greedy_alpha, 4),
        "measured_alpha_temperature_0.7": round(sampled_alpha, 4),
        "draft_parameters": sum(p.numel() for p in draft.parameters()),
        "target_parameters": sum(p.numel() for p in target.parameters()),
        "spec": asdict(spec),
    }
    for directory, model in ((target_dir, target), (draft_dir, draft)):
        if directory.exists():
            shutil.rmtree(directory)
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
    (out_dir / "controlled.json").write_text(json.dumps(record, indent=2) + "\n")
    logger.info("built %s: %s", out_dir, record)
    return target_dir, draft_dir


def refresh_chat_template(model_dir: Path) -> bool:
    """Give a pair built by an older version the current chat template; True if it changed.

    The template is tokenizer configuration only: vocabulary and weights stay as they are,
    so an existing build is brought up to date without retraining or recalibrating.
    """
    from transformers import AutoTokenizer

    from specbatch.decoding.tokenizer_build import CHAT_TEMPLATE

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.chat_template == CHAT_TEMPLATE:
        return False
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(model_dir)
    logger.info("%s: chat template updated to Qwen3's", model_dir)
    return True


def build_tiny_pair(out_dir: Path, force: bool = False) -> tuple[Path, Path]:
    """The embedded default pair (acceptance ≈ 0.7) in ``out_dir``/target and ``out_dir``/draft."""
    return build_controlled_pair(Path(out_dir), TINY_SPEC, TINY_ALPHA, force=force)


def build_benchmark_pairs(
    out_dir: Path, force: bool = False, spec: PairSpec = BENCH_SPEC
) -> dict[str, tuple[Path, Path]]:
    """The controlled pairs ``out_dir``/a50, a70, a90 used by the benchmarks."""
    return {
        name: build_controlled_pair(Path(out_dir) / name, spec, alpha, force=force)
        for name, alpha in CONTROLLED_ALPHAS.items()
    }
