"""A fixed-K engine's step seconds under bench_lookahead.py's relay, by how many steps
have passed since the relay handed the engine back: what a learning policy's evidence
looks like at each torch thread count.

``--engines`` fixed-K engines on one pair share the process as bench_lookahead's do; the
relay gives each 0.5 s slices in turn for ``--turns`` turns, and the first engine's
steps (the seconds its policy is told of) are grouped by their place in its slice.

    python scripts/profile_relay_steps.py --threads 2 --engines 12
    python scripts/profile_relay_steps.py --threads 1 --engines 12
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from bench_continuous import make_workload
from bench_lookahead import PROMPT_RANGE, ClosedLoop, Relay, load_pair, warmed_engine

from specbatch.decoding.lookahead import StepOutcome

SLICE_SECONDS = 0.5
RESUMED_AFTER = 0.2  # a gap this long between two steps: the relay had handed the engine on
LAST_PLACE = 4  # steps at this place in a slice or later are grouped together


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="a90")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--engines", type=int, default=12)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--models", type=Path, default=Path(".models"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(args.pair, args.models)
    warm_jobs = make_workload(pair, 4, seed=11, prompt_range=PROMPT_RANGE)
    jobs = make_workload(pair, 400, seed=13, prompt_range=PROMPT_RANGE)
    engines = {f"e{i}": warmed_engine(pair, f"fixed_{args.k}", warm_jobs) for i in range(args.engines)}
    steps: list[tuple[float, float]] = []  # (recorded at, seconds) of the first engine's steps
    first = engines["e0"].lookahead
    record = first.record

    def logged(step: StepOutcome) -> None:
        steps.append((time.perf_counter(), step.seconds))
        record(step)

    first.record = logged
    gc.collect()
    gc.freeze()
    relay = Relay()
    for name, engine in engines.items():
        engine.step_hook = relay.gate(name)
    loops = {name: ClosedLoop(engine, jobs, 1, "speculative") for name, engine in engines.items()}
    for _ in range(args.turns):
        for name, engine in engines.items():
            relay.hold(name, engine, SLICE_SECONDS)
    for name, loop in loops.items():
        relay.alone(name, engines[name], loop.stop)

    by_place: dict[int, list[float]] = {}
    place, last = 0, None
    for at, seconds in steps:
        place = 0 if last is None or at - last > RESUMED_AFTER else place + 1
        last = at
        by_place.setdefault(min(place, LAST_PLACE), []).append(seconds * 1000)
    print(
        f"{args.pair}, K = {args.k}, {args.threads} torch threads, {args.engines} engines, "
        f"{args.turns} turns of {SLICE_SECONDS} s slices: the first engine's {len(steps)} steps"
    )
    for place, values in sorted(by_place.items()):
        label = f"{place}+" if place == LAST_PLACE else str(place)
        print(f"  step {label} of a slice: {len(values)} steps, median {statistics.median(values):.1f} ms")


if __name__ == "__main__":
    main()
