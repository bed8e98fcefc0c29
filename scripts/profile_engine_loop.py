"""Where an engine's wall time goes in a closed loop, per K policy: the seconds in each
part of an iteration (prefill, draft catch-up, the speculative and plain passes), the
prompt tokens fed per model, the rows running, waiting and ready to decode per
iteration, and tokens/s on the wall clock against what the steps' own records (what
the goodput policy learns from) say.

Policies run one after another, each on a fresh engine warmed as in
scripts/bench_lookahead.py and the same fresh workload, so their absolute rates carry
the machine's drift between runs; compare shares and per-iteration counts, and take
rates from bench_lookahead.py's relay.

    python scripts/profile_engine_loop.py --pair a90 --concurrency 32 \
        --policies target_only fixed_2 fixed_7
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from bench_continuous import make_workload
from bench_lookahead import (
    PAIRS,
    POLICIES,
    PROMPT_RANGE,
    WARM_PER_CLIENT,
    ClosedLoop,
    load_pair,
    warmed_engine,
)

from specbatch.decoding import Engine, ModelPair
from specbatch.decoding.lookahead import StepOutcome

ENGINE_PARTS = ("_prefill", "_catch_up", "_decode", "_deliver", "_choose_lookahead")
RUNNER_PARTS = ("speculative_step", "plain_step")


def instrument(engine: Engine, seconds: Counter, counts: Counter, recorded: list[float]) -> None:
    """Time the engine's parts in place, count what each iteration holds and feeds, and
    sum the tokens and seconds its steps report to the lookahead policy."""

    def timed(owner: object, name: str, key: str) -> None:
        inner = getattr(owner, name)

        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                seconds[key] += time.perf_counter() - started

        setattr(owner, name, wrapper)

    for name in ENGINE_PARTS:
        timed(engine, name, name.lstrip("_"))
    for name in RUNNER_PARTS:
        timed(engine.runner, name, name)
    prefill = engine.runner.prefill

    def counted_prefill(rows, name, budget, *args):
        fed = prefill(rows, name, budget, *args)
        counts[f"{name} prompt tokens fed"] += fed
        return fed

    engine.runner.prefill = counted_prefill
    iterate = engine._iterate

    def counted_iterate(*args):
        counts["iterations"] += 1
        counts["running"] += len(engine._running)
        counts["waiting"] += len(engine._waiting)
        counts["ready"] += sum(1 for row in engine._running if row.prefilled())
        return iterate(*args)

    engine._iterate = counted_iterate
    record = engine.lookahead.record

    def recording(step: StepOutcome) -> None:
        recorded[0] += step.committed
        recorded[1] += step.seconds
        record(step)

    engine.lookahead.record = recording


def profile(pair: ModelPair, policy: str, concurrency: int, window: float) -> str:
    """One policy's closed loop: a warm-up, then ``window`` seconds measured."""
    engine = warmed_engine(pair, policy, make_workload(pair, 4, seed=11, prompt_range=PROMPT_RANGE))
    seconds, counts, recorded = Counter(), Counter(), [0.0, 0.0]
    instrument(engine, seconds, counts, recorded)
    jobs = make_workload(pair, 400, seed=13, prompt_range=PROMPT_RANGE)
    loop = ClosedLoop(engine, jobs, concurrency, "target_only" if policy == "target_only" else "speculative")
    time.sleep(0.4 + WARM_PER_CLIENT * concurrency)
    seconds.clear()
    counts.clear()
    recorded[:] = [0.0, 0.0]
    tokens, steps = loop.tokens, engine.lookahead_steps
    started = time.perf_counter()
    time.sleep(window)
    elapsed = time.perf_counter() - started
    tokens = loop.tokens - tokens
    steps = {k: n - steps.get(k, 0) for k, n in engine.lookahead_steps.items() if n - steps.get(k, 0)}
    shares, held = dict(seconds), dict(counts)
    loop.stop()
    iterations = max(1, held["iterations"])
    lines = [
        f"{policy}: {tokens / elapsed:.0f} tok/s on the wall clock; steps' records "
        f"{recorded[0] / max(recorded[1], 1e-9):.0f} tok/s over {recorded[1]:.2f} s; steps by K {steps}",
        f"    per iteration ({iterations}): running {held['running'] / iterations:.1f}, waiting "
        f"{held['waiting'] / iterations:.1f}, ready to decode {held['ready'] / iterations:.1f}",
        "    seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1])),
        "    " + ", ".join(f"{k} {v}" for k, v in held.items() if "fed" in k),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pair", choices=sorted(PAIRS), default="a90")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=["target_only", "goodput"])
    parser.add_argument("--window", type=float, default=6.0, help="seconds measured per policy")
    parser.add_argument("--models", type=Path, default=Path(".models"))
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1, as in bench_lookahead.py)"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    pair = load_pair(args.pair, args.models)
    for policy in args.policies:
        print(profile(pair, policy, args.concurrency, args.window), flush=True)


if __name__ == "__main__":
    main()
