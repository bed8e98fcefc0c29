"""What log-probabilities and penalties cost a decode step: throughput with each, against none.

On the embedded tiny pair (or ``--models``), one batch of ``--requests`` greedy rows
(prompts of 16-128 tokens, ``--new-tokens`` each, end of sequence off so every variant
does the same work) is served to the end by a fresh, warmed engine, once per variant:

- ``none``: the plain request;
- ``logprobs_0``: each token's log-probability (``logprobs=0``);
- ``logprobs_20``: and its 20 likeliest alternatives (``logprobs=20``);
- ``penalties``: presence 0.5, frequency 0.5 and repetition 1.1;
- ``both``: ``logprobs=20`` and the penalties.

Each variant runs speculatively at a fixed K (``--lookahead``, so that the K policy's
choices do not move with the step's cost) and target-only. The variants take turns in
every round, in an order rotated each round; the ratios are medians over rounds of each
variant's tokens/s over ``none``'s in the same round and mode. "same" counts the rows
whose speculative tokens equal the target-only ones (float32: a near tie may flip).

    python scripts/bench_sampling_options.py --out results/bench_sampling_options.json

Prints a markdown table, writes the JSON rows and a PNG (``--plot``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from specbatch.decoding import Engine, GenerationRequest, ModelPair, load_model_pair
from specbatch.decoding.tokenizer_build import corpus
from specbatch.figures import save_figure

logger = logging.getLogger("bench_sampling_options")

PENALTIES = {"presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1}
VARIANTS = {
    "none": {},
    "logprobs_0": {"logprobs": 0},
    "logprobs_20": {"logprobs": 20},
    "penalties": PENALTIES,
    "both": {"logprobs": 20, **PENALTIES},
}
COMPARED_MODES = ("speculative", "target_only")


def make_prompts(pair: ModelPair, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    stream = pair.tokenizer.encode(" ".join(corpus(lines=400, seed=seed)), add_special_tokens=False)
    prompts = []
    for _ in range(count):
        length = rng.randint(16, 128)
        start = rng.randrange(0, len(stream) - length)
        prompts.append(stream[start : start + length])
    return prompts


def serve_batch(
    pair: ModelPair, requests: list[GenerationRequest], mode: str, lookahead: int
) -> tuple[float, list]:
    """Tokens/s of one fresh, warmed engine serving ``requests`` to the end, and their tokens."""
    engine = Engine(pair, lookahead=lookahead, max_rows=len(requests))
    engine.generate([GenerationRequest(requests[0].prompt, max_new_tokens=4)], mode=mode)  # warm, calibrate
    started = time.perf_counter()
    results = engine.generate(requests, mode=mode)
    seconds = time.perf_counter() - started
    return sum(r.num_output_tokens for r in results) / seconds, [r.tokens for r in results]


def ratios(rows: list[dict]) -> list[dict]:
    """Per mode and variant: the median (and range) over rounds of its tokens/s over none's."""
    summary = []
    for mode in COMPARED_MODES:
        for variant in VARIANTS:
            per_round = []
            for round_index in sorted({r["round"] for r in rows}):
                mine = {r["variant"]: r for r in rows if (r["mode"], r["round"]) == (mode, round_index)}
                per_round.append(mine[variant]["tokens_per_s"] / mine["none"]["tokens_per_s"])
            speeds = [r["tokens_per_s"] for r in rows if (r["mode"], r["variant"]) == (mode, variant)]
            summary.append(
                {
                    "mode": mode,
                    "variant": variant,
                    "tokens_per_s": statistics.median(speeds),
                    "over_none": statistics.median(per_round),
                    "over_none_range": [min(per_round), max(per_round)],
                }
            )
    return summary


def plot(summary: list[dict], path: Path) -> Path:
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4))
    names = list(VARIANTS)
    for offset, mode in ((-0.2, "speculative"), (0.2, "target_only")):
        by_variant = {s["variant"]: s["over_none"] for s in summary if s["mode"] == mode}
        values = [by_variant[n] for n in names]
        axis.bar([i + offset for i in range(len(names))], values, 0.4, label=mode)
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set_xticks(range(len(names)), names)
    axis.set_ylabel("tokens/s over none (median of rounds)")
    axis.set_title("Log-probabilities and penalties: throughput against none (tiny pair, CPU)")
    axis.legend(loc="lower right")
    return save_figure(figure, path)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models", type=Path, default=Path(".models/tiny"), help="target/ and draft/ in here"
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--requests", type=int, default=16, help="rows of the batch")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--lookahead", type=int, default=4, help="the fixed K of the speculative runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--plot", type=Path, default=Path("docs/img/bench_sampling_options.png"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.manual_seed(0)
    pair = load_model_pair(str(args.models / "target"), str(args.models / "draft"), "cpu", args.dtype)
    pair.eos_token_ids.clear()  # every row runs its budget: the same work in every variant
    prompts = make_prompts(pair, args.requests, seed=3)

    for mode in COMPARED_MODES:  # the process's own first passes, charged to no variant
        serve_batch(pair, [GenerationRequest(p, max_new_tokens=8) for p in prompts], mode, args.lookahead)
    rows = []
    names = list(VARIANTS)
    for round_index in range(args.rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for variant in order:
            options = VARIANTS[variant]
            requests = [GenerationRequest(p, max_new_tokens=args.new_tokens, **options) for p in prompts]
            tokens = {}
            for mode in COMPARED_MODES:
                speed, tokens[mode] = serve_batch(pair, requests, mode, args.lookahead)
                rows.append({"round": round_index, "variant": variant, "mode": mode, "tokens_per_s": speed})
                logger.info("round %d %s %s: %.1f tokens/s", round_index, variant, mode, speed)
            same = sum(a == b for a, b in zip(tokens["speculative"], tokens["target_only"], strict=True))
            rows[-1]["same"] = rows[-2]["same"] = same

    summary = ratios(rows)
    print(f"| mode | variant | tokens/s | over none (median, range) | same ({args.requests} rows) |")
    print("|---|---|---|---|---|")
    for s in summary:
        same = min(r["same"] for r in rows if (r["mode"], r["variant"]) == (s["mode"], s["variant"]))
        low, high = s["over_none_range"]
        print(
            f"| {s['mode']} | {s['variant']} | {s['tokens_per_s']:.0f} | {s['over_none']:.2f}x "
            f"({low:.2f}-{high:.2f}) | {same} |"
        )
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__},
        "settings": {
            "models": str(args.models),
            "dtype": args.dtype,
            "requests": args.requests,
            "new_tokens": args.new_tokens,
            "lookahead": args.lookahead,
            "rounds": args.rounds,
        },
        "rows": rows,
        "summary": summary,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    print(f"plot: {plot(summary, args.plot)}")


if __name__ == "__main__":
    main()
