"""Why a pass on the engine's loop thread can run slower than the same pass on the main
thread of the same process (CPU only).

The engine steps on a thread of its own. Where the process's main thread has already
computed with several torch threads, it owns an OpenMP team, and the loop thread forms a
second one; with more OpenMP threads than cores, libgomp's workers stop spin-waiting
between parallel regions, so every small matmul pays a wake-up. This script measures it
in one process, side by side: a small linear and Hugging Face ``generate`` on the main
thread and on a second thread; then the linear on a second thread of fresh processes
whose main thread never computes, or computes on one thread only before handing the
threads on (what a CPU instance does since it loads its models under
``specbatch.decoding.cpu_threads.threads_for_the_engine_loop``).

    python scripts/bench_cpu_threads.py --model .models/controlled/a90/target

Prints one line per measurement; the figures and their reading are in docs/BENCHMARKS.md
("Speculative decoding").
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from specbatch.decoding.cpu_threads import threads_for_the_engine_loop

LINEAR_ROWS = (1, 8)


def linear_microseconds(rows: int, repeats: int = 3000) -> float:
    """Mean µs of an (rows × 512) · (512 × 1536) linear after a warm-up."""
    weight, inputs = torch.randn(1536, 512), torch.randn(rows, 512)
    for _ in range(300):
        torch.nn.functional.linear(inputs, weight)
    started = time.perf_counter()
    for _ in range(repeats):
        torch.nn.functional.linear(inputs, weight)
    return (time.perf_counter() - started) / repeats * 1e6


def on_second_thread(work: Callable[[], float]) -> float:
    """``work``'s result, run on a thread other than the main one."""
    found: list[float] = []
    thread = threading.Thread(target=lambda: found.append(work()))
    thread.start()
    thread.join()
    return found[0]


def generate_tokens_per_s(model_dir: Path, new_tokens: int = 32, runs: int = 5) -> Callable[[], float]:
    """A measurement of greedy ``generate`` at batch 1 (median of ``runs``) on a loaded model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompt = tokenizer("The quick brown fox jumps over the lazy dog and then", return_tensors="pt").input_ids

    def measure() -> float:
        rates = []
        with torch.inference_mode():
            for run in range(runs + 1):
                started = time.perf_counter()
                model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
                if run:  # the first call warms up
                    rates.append(new_tokens / (time.perf_counter() - started))
        return statistics.median(rates)

    return measure


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="a causal LM directory for the generate measurement")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the main thread")
    parser.add_argument(
        "--second-thread-only", action="store_true", help="time the linear on a second thread alone"
    )
    parser.add_argument(
        "--main-on-one-thread",
        action="store_true",
        help="with --second-thread-only: the main thread first computes on one thread, as an "
        "instance loads its models (specbatch.decoding.cpu_threads)",
    )
    args = parser.parse_args()
    if args.second_thread_only:
        with threads_for_the_engine_loop(args.threads):
            if args.main_on_one_thread:
                square = torch.randn(1024, 1024)
                (square @ square).sum()
        main = "computed on one thread" if args.main_on_one_thread else "never computing"
        for rows in LINEAR_ROWS:
            print(
                f"linear {rows} rows, second thread at {args.threads} thread(s), main {main}: "
                f"{on_second_thread(lambda r=rows: linear_microseconds(r)):.1f} us"
            )
        return
    torch.set_num_threads(args.threads)
    for rows in LINEAR_ROWS:
        print(f"linear {rows} rows, main thread: {linear_microseconds(rows):.1f} us")
        second = on_second_thread(lambda r=rows: linear_microseconds(r))
        print(f"linear {rows} rows, second thread: {second:.1f} us")
    if args.model:
        measure = generate_tokens_per_s(args.model)
        print(f"generate, main thread: {measure():.1f} tok/s")
        print(f"generate, second thread: {on_second_thread(measure):.1f} tok/s")
    # fresh processes whose main thread never computes, or computes on one thread only
    for extra in ([], ["--main-on-one-thread"]):
        command = [sys.executable, __file__, "--threads", str(args.threads), "--second-thread-only"]
        subprocess.run(command + extra, check=True)


if __name__ == "__main__":
    main()
