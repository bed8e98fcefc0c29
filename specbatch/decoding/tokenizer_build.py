"""Byte-level BPE tokenizers with Qwen3's special tokens, built offline.

The tiny models need a tokenizer that loads with AutoTokenizer exactly like the real
Qwen3 one (same special tokens, a chat template) without downloading anything. It is
trained on a corpus generated here from fixed word lists and the task renderings
the server sees, with a seeded generator, so every build gives the same vocabulary.

The production-shaped pair needs one of the real tokenizer's size instead: Qwen3's
151,643 regular tokens then its 26 added tokens at the same ids (151,643..151,668), so
len(tokenizer) = 151,669 is smaller than the 151,936 embedding rows, as in the
published checkpoints. Its vocabulary is the trained one filled up with merges of
byte-level symbols in a fixed order (no corpus could be trained that far offline).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

QWEN3_REGULAR_TOKENS = 151_643
# Qwen3's added tokens in id order from 151,643 (Qwen/Qwen3-8B tokenizer_config.json):
# (content, special). The tool, fill-in-the-middle and think markers are not special, so
# decoding with skip_special_tokens keeps them, as the real tokenizer does.
QWEN3_ADDED_TOKENS = (
    *((name, True) for name in SPECIAL_TOKENS),
    *(
        (f"<|{name}|>", True)
        for name in (
            "object_ref_start",
            "object_ref_end",
            "box_start",
            "box_end",
            "quad_start",
            "quad_end",
            "vision_start",
            "vision_end",
            "vision_pad",
            "image_pad",
            "video_pad",
        )
    ),
    ("<tool_call>", False),
    ("</tool_call>", False),
    *(
        (f"<|{name}|>", False)
        for name in ("fim_prefix", "fim_middle", "fim_suffix", "fim_pad", "repo_name", "file_sep")
    ),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

# Qwen3's own chat template (Qwen/Qwen3-8B tokenizer_config.json, Apache-2.0): system turn,
# tools, reasoning content of earlier assistant turns, and the `enable_thinking` switch
# whose False value opens the assistant turn with an empty think block (non-thinking mode).
CHAT_TEMPLATE = (Path(__file__).with_name("qwen3_chat_template.jinja")).read_text().rstrip("\n")

_CORPUS_WORDS = " ".join(
    (
        "the a an of to and in is it that for on with as was by this be are from or at which not have one",
        "all their has can more will about when there other who what into time only new some could these",
        "two may first then do any like my now over such our man me even most made after also did many",
        "before must through back years where much your way well down should because each just those",
        "people how too little state good very make world still own see men work long get here between",
        "both life being under never day same another know while last might us great old year off come",
        "since against go came right used take three patient disease treatment cell blood heart drug dose",
        "clinical symptom infection acute chronic therapy diagnosis medical anatomy nerve muscle bone",
        "kidney liver graph node edge path weight shortest source target directed write explain describe",
        "list summarize poem story email letter plan answer question instruction generation options",
        "choices answer think tokens brief concise detailed example reason because therefore however",
    )
).split()

_TEMPLATES = (
    "Instruction: {s}\nQuestion: {s}\nGeneration:",
    "The following is a multiple choice question (with answers) about {w}.  Output the answer in the "
    'format of "The answer is (X)" at the end.\n\nQuestion: {s}?\n Options:\nA. {w}\nB. {w}\nC. {w}\n'
    "D. {w}\nAnswer: The answer is (B)",
    "Question:\n{s}?\n\nChoices:\nA. {w}\nB. {w}\nC. {w}\nD. {w}\nE. {w}",
    "You are given a directed graph with {n} nodes (numbered 0 to {m}) and the following edges:\n"
    "Edges (source -> target, weight):\n{n} -> {m}, weight: {n}\nFind the top {n} shortest path(s) from "
    "node {n} to node {m}.\nsubmit_paths(paths=[[{n}, {m}]], weights=[{n}])",
    "{S}. {s}, {s}. Think for {n} tokens.",
    "<|im_start|>user\n{s}<|im_end|>\n<|im_start|>assistant\n{s}<|im_end|>",
)


def corpus(lines: int = 4000, seed: int = 0) -> list[str]:
    """Deterministic text in the shapes the server handles."""
    rng = random.Random(seed)

    def sentence() -> str:
        return " ".join(rng.choice(_CORPUS_WORDS) for _ in range(rng.randint(4, 14)))

    out = []
    for _ in range(lines):
        template = rng.choice(_TEMPLATES)
        while "{" in template:
            template = (
                template.replace("{s}", sentence(), 1)
                .replace("{S}", sentence().capitalize(), 1)
                .replace("{w}", rng.choice(_CORPUS_WORDS), 1)
                .replace("{n}", str(rng.randint(0, 99)), 1)
                .replace("{m}", str(rng.randint(0, 99)), 1)
            )
        out.append(template)
    return out


def _byte_level(model: object) -> object:
    """A ``tokenizers.Tokenizer`` over the BPE ``model`` that splits and decodes bytes."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers

    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _trained_bpe(vocab_size: int, special_tokens: list[str]) -> object:
    """A byte-level BPE (a ``tokenizers.Tokenizer``) trained on :func:`corpus`."""
    from tokenizers import models, pre_tokenizers, trainers

    tokenizer = _byte_level(models.BPE())
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return tokenizer


def _save(tokenizer: object, out_dir: Path, special: list[str]) -> None:
    """Wrap ``tokenizer`` as Qwen3's is wrapped (EOS, padding, chat template) and save it."""
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[t for t in special if t not in ("<|im_end|>", "<|endoftext|>")],
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.save_pretrained(out_dir)


def build_tokenizer(out_dir: Path, vocab_size: int = 2048) -> None:
    """Train the BPE on the corpus and save it (tokenizer.json + config) in ``out_dir``."""
    _save(_trained_bpe(vocab_size, SPECIAL_TOKENS), out_dir, ["<|im_start|>"])


def _filled_merges(vocab: dict[str, int], merges: list[tuple[str, str]], size: int) -> None:
    """Add merges to ``vocab``/``merges`` in place until ``vocab`` holds ``size`` tokens:
    every byte-level symbol pair in sorted order, then those pairs extended by a symbol,
    and so on. Each new token joins two tokens already present, so the BPE stays valid."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    level = alphabet
    while len(vocab) < size:
        grown = []
        for left in level:
            for right in alphabet:
                if len(vocab) == size:
                    return
                if left + right not in vocab:
                    vocab[left + right] = len(vocab)
                    merges.append((left, right))
                    grown.append(left + right)
        level = grown


def build_qwen3_sized_tokenizer(out_dir: Path) -> None:
    """A tokenizer of the real Qwen3 one's size and added-token ids, saved in ``out_dir``."""
    from tokenizers import AddedToken, models

    state = json.loads(_trained_bpe(QWEN3_REGULAR_TOKENS, []).to_str())["model"]
    vocab = dict(sorted(state["vocab"].items(), key=lambda item: item[1]))
    merges = [tuple(merge) for merge in state["merges"]]
    _filled_merges(vocab, merges, QWEN3_REGULAR_TOKENS)
    tokenizer = _byte_level(models.BPE(vocab=vocab, merges=merges))
    tokenizer.add_tokens(
        [AddedToken(text, special=special, normalized=False) for text, special in QWEN3_ADDED_TOKENS]
    )
    _save(tokenizer, out_dir, [text for text, special in QWEN3_ADDED_TOKENS if special])
