"""What prefix reuse costs where nothing is shared: the share of engine time spent in the
prefix cache's bookkeeping, reuse on and off.

The no-shared-prefix workload of ``bench_prefix.py`` (every prompt its own 1536 tokens
plus a user turn), closed loop at each concurrency. Every method the engine calls on its
:class:`~specbatch.decoding.prefix_cache.PrefixCache` is timed (the hashing of full
blocks, matching, recording, releasing, forgetting evicted blocks), and the sum is
divided by the run's wall time. A ratio of throughputs cannot resolve a cost of a few
tenths of a percent on a shared machine whose runs vary by 15 %; this measures it.

    python scripts/profile_prefix_bookkeeping.py
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from bench_continuous import run_closed_loop
from bench_prefix import make_workload

from specbatch.decoding import Engine, GenerationRequest, load_model_pair
from specbatch.decoding.prefix_cache import PrefixCache

TIMED = ("match", "revived", "admit", "record", "skip_written", "writable_end", "release", "_forget")


class Stopwatch:
    """Seconds spent inside each timed method, from any thread."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    def wrap(self, name: str, method: Callable) -> Callable:
        @functools.wraps(method)
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                with self._lock:
                    self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

        return timed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", type=Path, default=Path(".models/tiny"))
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--system-tokens", type=int, default=1536)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    args = parser.parse_args()
    stopwatch = Stopwatch()
    for name in TIMED:
        setattr(PrefixCache, name, stopwatch.wrap(name, getattr(PrefixCache, name)))
    torch.manual_seed(0)
    pair = load_model_pair(str(args.models / "target"), str(args.models / "draft"), "cpu", "float32")
    pair.eos_token_ids.clear()
    served, jobs = make_workload(pair, "no_shared_prefix", args.requests, args.system_tokens, args.new_tokens)
    print("| reuse | concurrency | wall (s) | bookkeeping (ms) | share of wall time |")
    print("|---|---|---|---|---|")
    for reuse in (True, False):
        for concurrency in args.concurrency:
            engine = Engine(pair, lookahead="goodput", max_rows=32, prefix_caching=reuse)
            engine.generate([GenerationRequest(served, max_new_tokens=2)])
            stopwatch.seconds.clear()
            started = time.perf_counter()
            run_closed_loop(engine, jobs, concurrency, "speculative")
            wall = time.perf_counter() - started
            spent = sum(stopwatch.seconds.values())
            print(
                f"| {'on' if reuse else 'off'} | {concurrency} | {wall:.1f} | {spent * 1000:.0f} "
                f"| {spent / wall:.2%} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
