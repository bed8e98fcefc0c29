"""Prefix reuse in the engine: a shared system prompt with short user turns, reuse off vs on.

On the embedded tiny pair (or ``--models``), closed loop at each ``--concurrency``: every
request is one system prompt of ``--system-tokens`` tokens followed by a short user turn
(8-48 tokens) and asks for ``--new-tokens`` greedy tokens. The engine has served the
system prompt once before the clock starts (as a server has, a moment into its life).
The control workload has the same lengths and no shared prefix: reuse must cost it
nothing. Per run: first-token p50/p95, output tokens per second, the prefix cache's hit
and miss tokens, and whether the greedy outputs equal those of reuse off. Off and on
run back to back ``--rounds`` times, alternating which goes first: the table and plot
show the first round, the ratios are the medians of the rounds' ratios with their range.

    python scripts/bench_prefix.py --quick --out results/bench_prefix.json

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
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from bench_continuous import Job, run_closed_loop, summarise

from specbatch.decoding import Engine, GenerationRequest, ModelPair, load_model_pair
from specbatch.decoding.tokenizer_build import corpus
from specbatch.figures import save_figure

logger = logging.getLogger("bench_prefix")

WORKLOADS = ("shared_system_prompt", "no_shared_prefix")


def token_stream(pair: ModelPair, seed: int) -> list[int]:
    return pair.tokenizer.encode(" ".join(corpus(lines=2000, seed=seed)), add_special_tokens=False)


def make_workload(
    pair: ModelPair, name: str, count: int, system_tokens: int, new_tokens: int
) -> tuple[list[int], list[Job]]:
    """The prompt served before the clock starts, and ``count`` jobs of a system prompt
    plus a user turn. For ``shared_system_prompt`` the served prompt is the system
    prompt; for ``no_shared_prefix`` each job leads with its own stretch of text of the
    same length, and the served prompt is one more such stretch."""
    rng = random.Random(17)
    stream = token_stream(pair, seed=5)
    system = stream[:system_tokens]

    def stretch() -> list[int]:
        start = rng.randrange(system_tokens, len(stream) - system_tokens)
        return stream[start : start + system_tokens]

    jobs = []
    for _ in range(count):
        turn_start = rng.randrange(system_tokens, len(stream) - 48)
        turn = stream[turn_start : turn_start + rng.randint(8, 48)]
        lead = stretch() if name == "no_shared_prefix" else system
        jobs.append(Job(lead + turn, new_tokens))
    return (stretch() if name == "no_shared_prefix" else system), jobs


def run(
    pair: ModelPair, served: list[int], jobs: list[Job], concurrency: int, reuse: bool, lookahead
) -> tuple[dict, list]:
    engine = Engine(pair, lookahead=lookahead, max_rows=32, prefix_caching=reuse)
    engine.generate([GenerationRequest(served, max_new_tokens=2)])  # calibrates, and is cached
    before = engine.snapshot()
    timings = run_closed_loop(engine, jobs, concurrency, "speculative")
    after = engine.snapshot()
    row = summarise(timings)
    row.update(
        prefix_hit_tokens=after.prefix_hit_tokens - before.prefix_hit_tokens,
        prefix_miss_tokens=after.prefix_miss_tokens - before.prefix_miss_tokens,
        evictions=after.evictions,
    )
    return row, [timings[i].result.tokens for i in range(len(jobs))]


def plot(rows: list[dict], path: Path) -> Path:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    groups = sorted({(r["workload"], r["concurrency"]) for r in rows})
    labels = [f"{'shared' if w == 'shared_system_prompt' else 'none'}\nc={c}" for w, c in groups]
    for axis, metric, title in (
        (axes[0], "ttft_p50_s", "first token p50 (s, lower is better)"),
        (axes[1], "tokens_per_s", "output tokens / s (higher is better)"),
    ):
        for offset, reuse in ((-0.2, False), (0.2, True)):
            values = [
                next(
                    r[metric] for r in rows if (r["workload"], r["concurrency"]) == g and r["reuse"] == reuse
                )
                for g in groups
            ]
            axis.bar(
                [i + offset for i in range(len(groups))],
                values,
                0.4,
                label=f"reuse {'on' if reuse else 'off'}",
            )
        axis.set_xticks(range(len(groups)), labels, fontsize=8)
        axis.set_xlabel("shared prefix, closed-loop concurrency")
        axis.set_yscale("log")
        axis.set_title(title)
        axis.legend()
    figure.suptitle("Prefix reuse in the engine (tiny pair, CPU)")
    return save_figure(figure, path)


def print_table(rows: list[dict]) -> None:
    print("| workload | concurrency | reuse | first token p50 (s) | p95 (s) | tokens/s | hit / miss tokens |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        reuse = "on" if r["reuse"] else "off"
        print(
            f"| {r['workload']} | {r['concurrency']} | {reuse} | {r['ttft_p50_s']:.3f} "
            f"| {r['ttft_p95_s']:.3f} | {r['tokens_per_s']:.1f} "
            f"| {r['prefix_hit_tokens']} / {r['prefix_miss_tokens']} |"
        )


def reuse_ratios(rows: list[dict], requests: int) -> list[dict]:
    """Per workload and concurrency: first-token p50 off / on and throughput on / off,
    each the median (and range) of the rounds' ratios, off and on run back to back."""
    ratios = []
    for workload, concurrency in sorted({(r["workload"], r["concurrency"]) for r in rows}):
        pairs = []
        for round_index in sorted({r["round"] for r in rows}):
            mine = {
                r["reuse"]: r
                for r in rows
                if (r["workload"], r["concurrency"], r["round"]) == (workload, concurrency, round_index)
            }
            pairs.append((mine[False], mine[True]))
        ttft = [off["ttft_p50_s"] / on["ttft_p50_s"] for off, on in pairs]
        throughput = [on["tokens_per_s"] / off["tokens_per_s"] for off, on in pairs]
        ratios.append(
            {
                "workload": workload,
                "concurrency": concurrency,
                "rounds": len(pairs),
                "ttft_p50_off_over_on": statistics.median(ttft),
                "ttft_p50_off_over_on_range": [min(ttft), max(ttft)],
                "throughput_on_over_off": statistics.median(throughput),
                "throughput_on_over_off_range": [min(throughput), max(throughput)],
                "same_greedy_outputs": f"{min(on['same_greedy_outputs'] for _, on in pairs)}/{requests}",
            }
        )
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer requests and a shorter system prompt")
    parser.add_argument(
        "--models", type=Path, default=Path(".models/tiny"), help="target/ and draft/ in here"
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--lookahead", default="goodput", help="goodput, adaptive_rule or a fixed K")
    parser.add_argument("--system-tokens", type=int, help="default 1536 (1024 with --quick)")
    parser.add_argument("--requests", type=int, help="per run; default 48 (16 with --quick)")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--concurrency", nargs="+", type=int, help="default 1 4 16 (1 4 with --quick)")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument(
        "--rounds", type=int, help="off and on back to back this many times (default 3, 1 with --quick)"
    )
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--plot", type=Path, default=Path("docs/img/bench_prefix.png"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    system_tokens = args.system_tokens or (1024 if args.quick else 1536)
    requests = args.requests or (16 if args.quick else 48)
    concurrencies = args.concurrency or ([1, 4] if args.quick else [1, 4, 16])
    rounds = args.rounds or (1 if args.quick else 3)
    lookahead = int(args.lookahead) if args.lookahead.isdigit() else args.lookahead
    torch.manual_seed(0)
    pair = load_model_pair(str(args.models / "target"), str(args.models / "draft"), "cpu", args.dtype)
    pair.eos_token_ids.clear()  # every row runs its budget: the same work with reuse off and on

    rows = []
    for workload in args.workloads:
        served, jobs = make_workload(pair, workload, requests, system_tokens, args.new_tokens)
        for concurrency in concurrencies:
            for round_index in range(rounds):
                outputs = {}
                # alternate which goes first, so a drift of the machine favours neither
                for reuse in (False, True) if round_index % 2 == 0 else (True, False):
                    row, outputs[reuse] = run(pair, served, jobs, concurrency, reuse, lookahead)
                    row.update(workload=workload, concurrency=concurrency, reuse=reuse, round=round_index)
                    rows.append(row)
                    logger.info("%s", row)
                same = sum(a == b for a, b in zip(outputs[False], outputs[True], strict=True))
                rows[-1]["same_greedy_outputs"] = rows[-2]["same_greedy_outputs"] = same

    print_table([r for r in rows if r["round"] == 0])
    ratios = reuse_ratios(rows, requests)
    for ratio in ratios:
        print(ratio)
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__},
        "settings": {
            "models": str(args.models),
            "dtype": args.dtype,
            "lookahead": args.lookahead,
            "system_tokens": system_tokens,
            "requests": requests,
            "rounds": rounds,
            "new_tokens": args.new_tokens,
        },
        "rows": rows,
        "ratios": ratios,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    print(f"plot: {plot([r for r in rows if r['round'] == 0], args.plot)}")


if __name__ == "__main__":
    main()
