"""Loading a target model and its draft, with the tokenizer they must share."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch

from specbatch.decoding.host_memory import keep_freed_memory
from specbatch.decoding.models import Qwen3Forward

logger = logging.getLogger(__name__)

EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float64": torch.float64,
    "fp64": torch.float64,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


class IncompatiblePairError(ValueError):
    """Target and draft cannot be used together (their tokenizers disagree)."""


@dataclass
class ModelPair:
    """Target, optional draft, their shared tokenizer and the facts the scheduler needs."""

    target: Qwen3Forward
    draft: Qwen3Forward | None
    tokenizer: object
    device: torch.device
    eos_token_ids: set[int]
    max_context: int
    # the ids the tokenizer has and both models score; logits are cut to it, so the padding
    # rows of an embedding (Qwen3: 151,936 rows, 151,669 ids) are never drawn or chosen
    vocab_size: int
    hf_target: torch.nn.Module = field(repr=False)
    hf_draft: torch.nn.Module | None = field(repr=False, default=None)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token of one row occupies across target and draft."""
        draft_bytes = self.draft.kv_bytes_per_token if self.draft is not None else 0
        return self.target.kv_bytes_per_token + draft_bytes


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """bf16 on GPU, fp32 on CPU unless the caller names one."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return _DTYPES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}") from None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")


def _load_model(name: str, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    # safetensors only: a pickled checkpoint (pytorch_model.bin) can run code when loaded.
    model = AutoModelForCausalLM.from_pretrained(
        name, dtype=dtype, local_files_only=_offline(), use_safetensors=True
    )
    if model.config.model_type != "qwen3":
        raise ValueError(f"{name}: model_type {model.config.model_type!r} is not supported; only qwen3 is")
    return model.to(device).eval()


def _load_tokenizer(name: str) -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name, local_files_only=_offline())


def load_model_pair(
    target: str, draft: str | None = None, device: str = "cpu", dtype: str | None = None
) -> ModelPair:
    """Load target (+ draft) from hub ids or local directories through ``from_pretrained``.

    Refuses a pair whose tokenizers map text to different ids; when the lm_head sizes
    differ or exceed the tokenizer (padding rows), decoding uses the ids all three share.
    A checkpoint with tied embeddings (Qwen3-0.6B has no lm_head tensor) and sharded
    safetensors (an index file beside the shards) load the same way. Malloc is set up
    first (host_memory), before the tokenizers' threads take arenas of their own.
    """
    keep_freed_memory()
    torch_device = torch.device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    logger.info("loading target %s on %s as %s", target, torch_device, torch_dtype)
    tokenizer = _load_tokenizer(target)
    hf_target = _load_model(target, torch_dtype, torch_device)
    hf_draft = None
    if draft is not None:
        logger.info("loading draft %s", draft)
        draft_tokenizer = _load_tokenizer(draft)
        if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
            raise IncompatiblePairError(
                f"draft {draft} and target {target} have different vocabularies; "
                "speculative decoding needs one shared tokenizer"
            )
        hf_draft = _load_model(draft, torch_dtype, torch_device)
    return pair_from_models(hf_target, hf_draft, tokenizer)


def pair_from_models(
    hf_target: torch.nn.Module, hf_draft: torch.nn.Module | None, tokenizer: object
) -> ModelPair:
    """Wrap already-loaded Hugging Face Qwen3 models (same device and dtype) as a pair."""
    scored = hf_target.lm_head.weight.shape[0]
    if hf_draft is not None:
        scored = min(scored, hf_draft.lm_head.weight.shape[0])
    if len(tokenizer) > scored:
        raise IncompatiblePairError(
            f"the tokenizer has {len(tokenizer)} ids but the models only score {scored}"
        )
    target_forward = Qwen3Forward(hf_target)
    draft_forward = Qwen3Forward(hf_draft) if hf_draft is not None else None
    max_context = target_forward.max_positions
    if draft_forward is not None:
        if draft_forward.device != target_forward.device or draft_forward.dtype != target_forward.dtype:
            raise IncompatiblePairError("target and draft must share one device and dtype")
        max_context = min(max_context, draft_forward.max_positions)
    vocab = tokenizer.get_vocab()
    eos_ids = {vocab[t] for t in EOS_TOKENS if t in vocab}
    if tokenizer.eos_token_id is not None:
        eos_ids.add(int(tokenizer.eos_token_id))
    return ModelPair(
        target=target_forward,
        draft=draft_forward,
        tokenizer=tokenizer,
        device=target_forward.device,
        eos_token_ids=eos_ids,
        max_context=max_context,
        vocab_size=len(tokenizer),
        hf_target=hf_target,
        hf_draft=hf_draft,
    )
