"""Continuous vs static batching and KV memory, side by side.

On the controlled-acceptance pairs (a50, a70, a90: target = draft + ε-scaled layers;
``--spec tiny`` builds them on the embedded default's shapes, whose passes cost about
the same at batch 1 and 32 on a CPU, as decode does on a GPU; ``--spec bench`` on the
larger shapes of scripts/bench_specdec.py, which are compute-bound on a 2-core CPU) with
one mixed workload (60 % of rows 8-32 new tokens, 40 % 96-256; prompts 16-512
tokens; greedy; end-of-sequence off so every row runs its budget):

1. Open loop, same Poisson arrivals for every set-up: static batches (a batch is
   formed, then run to completion) vs continuous batching, each target-only and
   speculative (goodput K). The offered rate is ``--load`` times the capacity of
   continuous target-only decoding, measured first on a burst of the same workload.
2. KV memory: the pool's peak (blocks x block size) against the tokens rows held at
   that moment and against one rectangular cache per batch.

Which K policy pays under load (every fixed K, the rule, goodput; closed loop at
concurrency 1 to 32) is scripts/bench_lookahead.py.

    python scripts/bench_continuous.py --quick --out results/bench_continuous.json

Prints markdown tables, writes the JSON rows and a PNG (``--plot``).
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
import threading
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from tqdm import tqdm

from specbatch.decoding import Engine, GenerationRequest, GenerationResult, ModelPair, load_model_pair
from specbatch.decoding.tiny import BENCH_SPEC, CONTROLLED_ALPHAS, TINY_SPEC, build_benchmark_pairs
from specbatch.decoding.tokenizer_build import corpus
from specbatch.figures import save_figure

logger = logging.getLogger("bench_continuous")


@dataclass(frozen=True)
class Job:
    prompt: list[int]
    new_tokens: int


@dataclass
class Timing:
    submitted: float = 0.0
    first_token: float | None = None
    finished: float | None = None
    result: GenerationResult | None = None


def make_workload(pair: ModelPair, count: int, seed: int, prompt_range: tuple[int, int]) -> list[Job]:
    """Mixed lengths: 60 % short answers (8-32 tokens), 40 % long ones (96-256)."""
    rng = random.Random(seed)
    text = " ".join(corpus(lines=400, seed=seed))
    stream = pair.tokenizer.encode(text, add_special_tokens=False)
    jobs = []
    for _ in range(count):
        length = rng.randint(*prompt_range)
        start = rng.randrange(0, len(stream) - length)
        new_tokens = rng.randint(8, 32) if rng.random() < 0.6 else rng.randint(96, 256)
        jobs.append(Job(stream[start : start + length], new_tokens))
    return jobs


class _Sink:
    """Records first-token and finish times of the rows of one submission."""

    def __init__(self, timings: dict[int, Timing], done: threading.Semaphore) -> None:
        self.timings = timings
        self.done = done

    def on_tokens(self, updates: dict[int, list[int]]) -> None:
        now = time.monotonic()
        for key in updates:
            if self.timings[key].first_token is None:
                self.timings[key].first_token = now

    def on_finished(self, key: int, result: GenerationResult) -> None:
        self.timings[key].finished = time.monotonic()
        self.timings[key].result = result
        self.done.release()


def _request(job: Job) -> GenerationRequest:
    return GenerationRequest(job.prompt, max_new_tokens=job.new_tokens)


def run_open_loop(engine: Engine, jobs: list[Job], arrivals: list[float], mode: str) -> dict[int, Timing]:
    """Submit each job at its arrival offset; wait for all."""
    timings = {i: Timing() for i in range(len(jobs))}
    done = threading.Semaphore(0)
    start = time.monotonic()
    for i, (job, at) in enumerate(zip(jobs, arrivals, strict=True)):
        delay = start + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        timings[i].submitted = time.monotonic()
        sink = _Sink({0: timings[i]}, done)
        engine.submit(_request(job), sink, key=0, mode=mode)
    for _ in jobs:
        done.acquire()
    return timings


def run_closed_loop(engine: Engine, jobs: list[Job], concurrency: int, mode: str) -> dict[int, Timing]:
    """``concurrency`` clients, each submitting its next job when the last one finished."""
    timings = {i: Timing() for i in range(len(jobs))}
    queue = list(range(len(jobs)))
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                if not queue:
                    return
                index = queue.pop(0)
            done = threading.Semaphore(0)
            timings[index].submitted = time.monotonic()
            engine.submit(_request(jobs[index]), _Sink({0: timings[index]}, done), key=0, mode=mode)
            done.acquire()

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return timings


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summarise(timings: dict[int, Timing]) -> dict:
    done = list(timings.values())
    tokens = sum(t.result.num_output_tokens for t in done)
    makespan = max(t.finished for t in done) - min(t.submitted for t in done)
    ttft = [t.first_token - t.submitted for t in done]
    e2e = [t.finished - t.submitted for t in done]
    return {
        "tokens_per_s": tokens / makespan,
        "ttft_p50_s": statistics.median(ttft),
        "ttft_p95_s": _percentile(ttft, 0.95),
        "e2e_p50_s": statistics.median(e2e),
        "e2e_p95_s": _percentile(e2e, 0.95),
        "requests": len(done),
        "seconds": makespan,
    }


def _engine(pair: ModelPair, lookahead, batching: str = "continuous") -> Engine:
    engine = Engine(pair, lookahead=lookahead, batching=batching, max_rows=32)
    engine.generate([GenerationRequest([5, 6, 7], max_new_tokens=4)])  # calibrate and warm up
    return engine


def open_loop(pair_name: str, pair: ModelPair, args) -> list[dict]:
    jobs = make_workload(pair, args.open_requests, seed=7, prompt_range=args.prompt_range)
    burst = run_open_loop(_engine(pair, 0), jobs, [0.0] * len(jobs), "target_only")
    capacity = len(jobs) / summarise(burst)["seconds"]
    rate = args.load * capacity
    rng = random.Random(11)
    arrivals, clock = [], 0.0
    for _ in jobs:
        clock += rng.expovariate(rate)
        arrivals.append(clock)
    logger.info(
        "%s: continuous target-only capacity %.2f req/s; offering %.2f req/s", pair_name, capacity, rate
    )
    reference = [t.result.tokens for t in burst.values()]
    rows = []
    setups = [(b, m) for m in ("target_only", "speculative") for b in ("static", "continuous")]
    for batching, mode in tqdm(setups, desc=f"{pair_name} open loop", leave=False):
        engine = _engine(pair, "goodput" if mode == "speculative" else 0, batching)
        timings = run_open_loop(engine, jobs, arrivals, mode)
        outputs = [timings[i].result.tokens for i in range(len(jobs))]
        memory = engine.memory_peaks
        bytes_per_token = pair.kv_bytes_per_token
        rows.append(
            {
                "part": "open_loop",
                "pair": pair_name,
                "mode": mode,
                "batching": batching,
                "rate": rate,
                "capacity_rps": capacity,
                **summarise(timings),
                "exact": outputs == reference,
                "exact_fraction": sum(o == r for o, r in zip(outputs, reference, strict=True)) / len(jobs),
                "kv_peak_reserved_tokens": memory.reserved_tokens,
                "kv_held_tokens_at_peak": memory.held_tokens_at_peak,
                "kv_rectangular_tokens": memory.rectangular_tokens,
                "kv_peak_bytes": memory.reserved_tokens * bytes_per_token,
                "kv_rectangular_bytes": memory.rectangular_tokens * bytes_per_token,
                "preemptions": engine.snapshot().preemptions,
                "mean_k": _mean_k(engine.lookahead_steps),
            }
        )
    return rows


def _mean_k(steps: dict[int, int]) -> float:
    total = sum(steps.values())
    return sum(k * n for k, n in steps.items()) / total if total else 0.0


def open_loop_table(rows: list[dict]) -> str:
    lines = [
        "| pair | mode | batching | rate req/s | tokens/s | TTFT p50 / p95 s | e2e p50 / p95 s "
        "| mean K | KV peak / held | rectangular / peak | exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['pair']} | {r['mode']} | {r['batching']} | {r['rate']:.2f} | {r['tokens_per_s']:.0f} "
            f"| {r['ttft_p50_s']:.2f} / {r['ttft_p95_s']:.2f} | {r['e2e_p50_s']:.2f} / {r['e2e_p95_s']:.2f} "
            f"| {r['mean_k']:.2f} | {r['kv_peak_reserved_tokens'] / max(1, r['kv_held_tokens_at_peak']):.2f} "
            f"| {r['kv_rectangular_tokens'] / max(1, r['kv_peak_reserved_tokens']):.2f} "
            f"| {r['exact_fraction']:.0%} |"
        )
    return "\n".join(lines)


def verdicts(open_rows: list[dict]) -> list[str]:
    out = []
    for pair in sorted({r["pair"] for r in open_rows}):
        for mode in ("target_only", "speculative"):
            static, cont = (
                next(r for r in open_rows if (r["pair"], r["mode"], r["batching"]) == (pair, mode, b))
                for b in ("static", "continuous")
            )
            ratio = cont["tokens_per_s"] / static["tokens_per_s"]
            out.append(
                f"{pair} {mode}: continuous/static throughput {ratio:.2f}x (target >= 1.5x), "
                f"TTFT p95 {cont['ttft_p95_s']:.2f} s vs {static['ttft_p95_s']:.2f} s"
            )
    for r in open_rows:
        if r["batching"] == "continuous":
            out.append(
                f"{r['pair']} {r['mode']}: KV pool peak {r['kv_peak_reserved_tokens']} tokens = "
                f"{r['kv_peak_reserved_tokens'] / max(1, r['kv_held_tokens_at_peak']):.2f}x the tokens held "
                f"(target <= 1.2x); a rectangular cache per batch would take "
                f"{r['kv_rectangular_tokens'] / max(1, r['kv_peak_reserved_tokens']):.2f}x the pool's peak"
            )
    return out


def plot(open_rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    labels = [f"{r['pair']}\n{r['mode']}\n{r['batching']}" for r in open_rows]
    colours = ["tab:grey" if r["batching"] == "static" else "tab:blue" for r in open_rows]
    axes[0].bar(range(len(open_rows)), [r["tokens_per_s"] for r in open_rows], color=colours)
    axes[0].set_xticks(range(len(open_rows)), labels, fontsize=6)
    axes[0].set_ylabel("tokens/s (same Poisson arrivals)")
    axes[0].set_title("static (grey) vs continuous (blue)")
    axes[1].bar(range(len(open_rows)), [r["ttft_p95_s"] for r in open_rows], color=colours)
    axes[1].set_xticks(range(len(open_rows)), labels, fontsize=6)
    axes[1].set_ylabel("TTFT p95 (s)")
    save_figure(fig, path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="30 requests, a50 and a90")
    parser.add_argument("--spec", choices=("tiny", "bench"), default="tiny", help="shapes of the pairs")
    parser.add_argument("--models", type=Path, help="default .models/controlled_<spec>")
    parser.add_argument("--pairs", nargs="+", default=None, help="default a50 a70 a90 (a50 a90 with --quick)")
    parser.add_argument("--load", type=float, default=0.9, help="open-loop rate / continuous capacity")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--plot", type=Path, default=Path("docs/img/bench_continuous.png"))
    args = parser.parse_args()
    args.pairs = args.pairs or (["a50", "a90"] if args.quick else list(CONTROLLED_ALPHAS))
    args.open_requests = 30 if args.quick else 120
    args.prompt_range = (16, 512)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("specbatch").setLevel(logging.WARNING)
    torch.manual_seed(0)

    spec = TINY_SPEC if args.spec == "tiny" else BENCH_SPEC
    built = build_benchmark_pairs(args.models or Path(f".models/controlled_{args.spec}"), spec=spec)
    started = time.perf_counter()
    open_rows: list[dict] = []
    for name in args.pairs:
        pair_dir = built[name][0].parent
        pair = load_model_pair(str(pair_dir / "target"), str(pair_dir / "draft"))
        pair.eos_token_ids.clear()  # every row runs its full budget
        open_rows.extend(open_loop(name, pair, args))

    print(
        f"\n## Continuous batching benchmark ({'quick' if args.quick else 'full'}, {args.spec} pairs, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{torch.get_num_threads()} threads, {time.perf_counter() - started:.0f} s)\n"
    )
    print(open_loop_table(open_rows))
    print("\n" + "\n".join(f"- {line}" for line in verdicts(open_rows)))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(open_rows, indent=2) + "\n")
    plot(open_rows, args.plot)
    print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
