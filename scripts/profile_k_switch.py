"""Does a step that changes K cost more than one that repeats it?

A goodput choice log showed steps whose K differed from the step before running about
1.2x their predicted seconds, against 0.92x for steps repeating it. This drives one
engine, one row at a time, through a fixed pattern of Ks (no policy, so no choice
depends on how fast the last steps ran) and prints, per K, the median seconds of its
steps after a step of the same K and after a step of another: if changing K cost
anything (new shapes, cold caches), the second would be the slower.

    python scripts/profile_k_switch.py --pair a90 --patterns 7 7,7,7,4 4 4,4,4,7
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from bench_lookahead import load_pair

from specbatch.decoding import Engine
from specbatch.decoding.lookahead import BatchShape, StepOutcome
from specbatch.decoding.requests import GenerationRequest

PROMPT = "Explain the history of the printing press in detail. " * 4
SWITCH_TABLE_HEADER = (
    "| pattern | K | steps after the same K | median ms | steps after another K | median ms |\n"
    "|---|---|---|---|---|---|"
)


class PatternLookahead:
    """The Ks of ``pattern`` in turn, whatever the batch; keeps each step's K and seconds."""

    name = "pattern"

    def __init__(self, pattern: list[int]) -> None:
        self.pattern = pattern
        self.k = pattern[0]
        self.steps: list[tuple[int, float]] = []
        self._turn = 0

    @property
    def feeds_drafts(self) -> bool:
        return self.k > 0

    def choose(self, batch: BatchShape) -> int:
        self.k = self.pattern[self._turn % len(self.pattern)]
        self._turn += 1
        return self.k

    def record(self, step: StepOutcome) -> None:
        self.steps.append((step.lookahead, step.seconds))


def profile(engine: Engine, pattern: list[int], requests: int, tokens: int) -> list[str]:
    """Serve ``requests`` rows of ``tokens`` new tokens with the Ks of ``pattern``; a
    table row per K run."""
    policy = PatternLookahead(pattern)
    engine.lookahead = policy
    engine.generate([GenerationRequest(PROMPT, max_new_tokens=16)])  # warm-up, not counted
    policy.steps.clear()
    for _ in range(requests):
        engine.generate([GenerationRequest(PROMPT, max_new_tokens=tokens)])
    by_kind: dict[int, dict[bool, list[float]]] = defaultdict(lambda: {True: [], False: []})
    for (before, _), (k, seconds) in itertools.pairwise(policy.steps):
        by_kind[k][before == k].append(seconds * 1000)
    name = ",".join(map(str, pattern))
    rows = []
    for k in sorted(by_kind):
        same, other = by_kind[k][True], by_kind[k][False]
        rows.append(
            f"| {name} | {k} | {len(same)} | {statistics.median(same) if same else float('nan'):.2f} "
            f"| {len(other)} | {statistics.median(other) if other else float('nan'):.2f} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="a90")
    parser.add_argument("--patterns", nargs="+", default=["7", "7,7,7,4", "4", "4,4,4,7"])
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--models", type=Path, default=Path(".models"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # as a served cpu instance runs
    pair = load_pair(args.pair, args.models)
    print(SWITCH_TABLE_HEADER)
    for pattern in args.patterns:
        ks = [int(k) for k in pattern.split(",")]
        engine = Engine(pair, lookahead=ks[0])
        for row in profile(engine, ks, args.requests, args.tokens):
            print(row, flush=True)


if __name__ == "__main__":
    main()
