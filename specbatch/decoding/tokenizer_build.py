"""A small byte-level BPE tokenizer with Qwen3's special tokens, built offline.

The tiny models need a tokenizer that loads with AutoTokenizer exactly like the real
Qwen3 one (same special tokens, a chat template) without downloading anything. It is
trained on a corpus generated here from fixed word lists and the task renderings
the server sees, with a seeded generator, so every build gives the same vocabulary.
"""

from __future__ import annotations

import random
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

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


def build_tokenizer(out_dir: Path, vocab_size: int = 2048) -> None:
    """Train the BPE on the corpus and save it (tokenizer.json + config) in ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.save_pretrained(out_dir)
