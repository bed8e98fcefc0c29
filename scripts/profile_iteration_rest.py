"""What an engine iteration costs besides its passes, per K policy: the rest the goodput
policy prices once a step (admitting, choosing K, growing blocks, delivering).

One engine at a time serves ``--requests`` requests of bench_lookahead.py's workload as a
closed loop at ``--concurrency``; its own iteration cost models (fitted on the rest of
every speculative and every plain step it ran) give the rest a step, beside the seconds
of the step's passes and, for goodput, of its choice of K. Where a run's time went
besides: the share of its steps that ran plain, the draft tokens fed (catch-ups and
newcomers' prompts) and their seconds, and the wall seconds outside every step's (prompt
and draft prefills, which no step's seconds count; a step's include its rest), where a
policy that feeds drafts for nothing pays for them.
One engine's runs minutes apart differ by the machine's drift as well as by policy:
compare policies in `bench_lookahead.py`'s relay.

    python scripts/profile_iteration_rest.py --pair a70 --concurrency 1 --requests 16
    python scripts/profile_iteration_rest.py --pair a70 --concurrency 16 --requests 40
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from bench_continuous import Job, make_workload
from bench_lookahead import PROMPT_RANGE, ClosedLoop, load_pair, warmed_engine

from specbatch.decoding import Engine
from specbatch.decoding.lookahead import BatchShape, StepOutcome, iteration_costs_name
from specbatch.decoding.rows import Row

TABLE_HEADER = (
    "| policy | steps | rows a step | passes and catch-up a step (ms) | rest a step (ms) "
    "| choice (ms) | tok/s | plain steps | draft fed (tokens, s) | outside the steps (s) |"
    "\n|---|---|---|---|---|---|---|---|---|---|"
)


def profile(engine: Engine, jobs: list[Job], concurrency: int, requests: int) -> str:
    """Serve ``requests`` of ``jobs`` at ``concurrency`` on ``engine``; its table row."""
    steps: list[StepOutcome] = []
    choices: list[float] = []
    record, choose = engine.lookahead.record, engine.lookahead.choose

    def recorded(step: StepOutcome) -> None:
        steps.append(step)
        record(step)

    def timed(batch: BatchShape) -> int:
        started = time.perf_counter()
        k = choose(batch)
        choices.append(time.perf_counter() - started)
        return k

    engine.lookahead.record, engine.lookahead.choose = recorded, timed
    drafts_fed, draft_seconds = 0, 0.0
    prefill = engine.runner.prefill

    def timed_prefill(rows: Sequence[Row], name: str, *args: object, **kwargs: object) -> int:
        nonlocal drafts_fed, draft_seconds
        started = time.perf_counter()
        fed = prefill(rows, name, *args, **kwargs)
        if name == "draft":
            drafts_fed, draft_seconds = drafts_fed + fed, draft_seconds + time.perf_counter() - started
        return fed

    engine.runner.prefill = timed_prefill
    started = time.perf_counter()
    loop = ClosedLoop(engine, jobs, concurrency, "speculative", limit=requests)
    loop.finished.wait()
    wall = time.perf_counter() - started
    rows_each = [len(s.batch.alphas) + s.plain_beside for s in steps]
    rows = statistics.mean(rows_each)
    rest = statistics.mean(  # each step's kind (speculative or plain) has its own model
        engine.runner.costs[iteration_costs_name(s.lookahead)].predict(step_rows, 0, 0)
        for s, step_rows in zip(steps, rows_each, strict=True)
    )
    passes = statistics.mean(s.seconds for s in steps) - rest
    plain = sum(s.lookahead == 0 for s in steps) / len(steps)
    outside = wall - sum(s.seconds for s in steps)
    return (
        f"{len(steps)} | {rows:.1f} | {passes * 1e3:.2f} | {rest * 1e3:.2f} "
        f"| {statistics.mean(choices) * 1e3:.3f} | {loop.tokens / wall:.0f} | {plain:.0%} "
        f"| {drafts_fed}, {draft_seconds:.2f} | {outside:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="a70")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--policies", nargs="+", default=["fixed_0", "fixed_2", "goodput"])
    parser.add_argument("--models", type=Path, default=Path(".models"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = load_pair(args.pair, args.models)
    jobs = make_workload(pair, 400, seed=7, prompt_range=PROMPT_RANGE)
    print(TABLE_HEADER)
    for policy in args.policies:
        engine = warmed_engine(pair, policy, jobs)
        print(f"| {policy} | " + profile(engine, jobs[10:], args.concurrency, args.requests))


if __name__ == "__main__":
    main()
