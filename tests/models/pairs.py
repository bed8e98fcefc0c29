"""Small in-memory Qwen3 pairs for the model tests (built in-test, never downloaded).

Tests import these builders by name (``from pairs import make_pair``); the fixtures made
from them are in this folder's conftest.

The exactness tests run the models in float64: speculative verification feeds the
target K+1 tokens at once while target_only feeds one, and in float32 the two matmul
shapes may round differently, which can flip an argmax at a near-tie. In float64 the
rounding differences (~1e-16) are far below any logit gap these random models
produce, so an exact token-for-token assertion tests the algorithm, not the BLAS.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from specbatch.decoding import ModelPair, pair_from_models
from specbatch.decoding.tiny import PairSpec, extended_target, random_qwen3
from specbatch.decoding.tokenizer_build import build_tokenizer

SMALL_SPEC = PairSpec(
    hidden_size=64,
    intermediate_size=128,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    draft_layers=2,
    extra_target_layers=2,
    max_position_embeddings=512,
)


@functools.lru_cache(maxsize=1)
def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """The project's tiny BPE tokenizer (built once per test session)."""
    with tempfile.TemporaryDirectory() as scratch:
        build_tokenizer(Path(scratch), vocab_size=600)
        return AutoTokenizer.from_pretrained(scratch)


def letters_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``vocab_size`` ids (3 specials + letters), small enough
    that every outcome of two tokens can be enumerated."""
    names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"t{i}" for i in range(vocab_size - 3)]
    model = models.WordLevel({name: i for i, name in enumerate(names)}, unk_token="<|endoftext|>")
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )


def make_pair(
    draft_kind: str,
    epsilon: float = 0.3,
    dtype: torch.dtype = torch.float64,
    tokenizer: PreTrainedTokenizerFast | None = None,
    spec: PairSpec = SMALL_SPEC,
    keep_eos: bool = False,
) -> ModelPair:
    """``draft_kind``: "same" (draft = target), "unrelated" (independent weights) or
    "controlled" (target = draft + ε-scaled extra layers). EOS is disabled unless
    ``keep_eos``, so rows run to their token budget and outputs are long enough to compare."""
    tokenizer = tokenizer or bpe_tokenizer()
    vocab = len(tokenizer)
    draft = random_qwen3(spec, vocab, spec.draft_layers, tokenizer, seed=11, dtype=dtype)
    if draft_kind == "same":
        target = draft
    elif draft_kind == "unrelated":
        target = random_qwen3(spec, vocab, spec.draft_layers + spec.extra_target_layers, tokenizer, 12, dtype)
    elif draft_kind == "controlled":
        target = extended_target(draft, spec, tokenizer, epsilon=epsilon, seed=13)
    else:
        raise ValueError(draft_kind)
    pair = pair_from_models(target, draft, tokenizer)
    if not keep_eos:
        pair.eos_token_ids.clear()
    return pair


def attract_to_padding(lm_head: torch.Tensor, vocab: int) -> None:
    """Make the lm_head rows past ``vocab`` (embedding padding, never a token) the
    likeliest by far, in place: row ``vocab + k`` is 100 × the unit vector of hidden
    coordinate k, so some padded logit is about 100 × the largest normalised hidden
    coordinate, far above any real logit. A padded id drawn or chosen anywhere shows."""
    padding, hidden = lm_head.shape[0] - vocab, lm_head.shape[1]
    rows = 100.0 * torch.eye(hidden, dtype=lm_head.dtype, device=lm_head.device)
    lm_head.data[vocab:] = rows[torch.arange(padding) % hidden]


def prompts(count: int, vocab: int, seed: int = 0, min_len: int = 1, max_len: int = 17) -> list[list[int]]:
    """Random token-id prompts of different lengths (mixed-length batches)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=generator))
        out.append(torch.randint(3, vocab, (length,), generator=generator).tolist())
    return out
