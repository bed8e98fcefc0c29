"""What an engine iteration costs besides its passes, per K policy: the rest the goodput
policy prices once a step (admitting, choosing K, growing blocks, delivering).

One engine at a time serves ``--requests`` requests of bench_lookahead.py's workload as a
closed loop at ``--concurrency``; its own iteration cost models (fitted on the rest of
every speculative and every plain step it ran) give the rest a step, beside the seconds
of the step's passes and, for goodput, of choosing K and recording what each step
delivered. Where a run's time went besides: the share of its steps that ran plain, the
switches from plain decoding to a K > 0 (a probe or a switch on, each first catching up
every lagging draft), the draft tokens fed (catch-ups and newcomers' prompts) and their
seconds, and the wall seconds outside every step's (prompt and draft prefills, which no
step's seconds count; a step's include its rest), where a policy that feeds drafts for
nothing pays for them. ``--loops`` serves that many closed loops one after another on
the same engine, a row each: a fresh engine's first loop learns what the later ones
exploit.
One engine's runs minutes apart differ by the machine's drift as well as by policy:
compare policies in `bench_lookahead.py`'s relay.

    python scripts/profile_iteration_rest.py --pair a70 --concurrency 1 --requests 16
    python scripts/profile_iteration_rest.py --pair a70 --concurrency 16 --requests 40
    python scripts/profile_iteration_rest.py --pair a50 --concurrency 16 --requests 64 \
        --loops 3 --policies goodput
"""

from __future__ import annotations

import argparse
import copy
import itertools
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
    "| policy | loop | steps | rows a step | passes and catch-up a step (ms) | rest a step (ms) "
    "| choice (ms) | choices, records (s) | tok/s | plain steps | switches to K > 0 "
    "| draft fed (tokens, s) | outside the steps (s) |"
    "\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


class Counted:
    """Counts what ``engine`` spends besides its passes, from its installation on: its
    policy's choices of K and records of each step (and their seconds), and the tokens
    its drafts are fed (and their seconds)."""

    def __init__(self, engine: Engine) -> None:
        self.steps: list[StepOutcome] = []
        self.choices: list[float] = []
        self.record_seconds = 0.0
        self.drafts_fed, self.draft_seconds = 0, 0.0
        policy, runner = engine.lookahead, engine.runner
        record, choose, prefill = policy.record, policy.choose, runner.prefill

        def recorded(step: StepOutcome) -> None:
            self.steps.append(step)
            started = time.perf_counter()
            record(step)
            self.record_seconds += time.perf_counter() - started

        def timed(batch: BatchShape) -> int:
            started = time.perf_counter()
            k = choose(batch)
            self.choices.append(time.perf_counter() - started)
            return k

        def timed_prefill(rows: Sequence[Row], name: str, *args: object, **kwargs: object) -> int:
            started = time.perf_counter()
            fed = prefill(rows, name, *args, **kwargs)
            if name == "draft":
                self.drafts_fed += fed
                self.draft_seconds += time.perf_counter() - started
            return fed

        policy.record, policy.choose, runner.prefill = recorded, timed, timed_prefill

    def snapshot(self) -> Counted:
        """What has been counted so far, kept apart from what is counted next."""
        taken = copy.copy(self)
        taken.steps, taken.choices = list(self.steps), list(self.choices)
        return taken

    def since(self, mark: Counted) -> Counted:
        """What was counted after ``mark`` (a snapshot taken earlier)."""
        later = copy.copy(self)
        later.steps, later.choices = self.steps[len(mark.steps) :], self.choices[len(mark.choices) :]
        later.record_seconds -= mark.record_seconds
        later.drafts_fed -= mark.drafts_fed
        later.draft_seconds -= mark.draft_seconds
        return later


def profile(engine: Engine, counted: Counted, jobs: list[Job], concurrency: int, requests: int) -> str:
    """Serve ``requests`` of ``jobs`` at ``concurrency`` on ``engine`` (its spending
    ``counted``); its table row."""
    mark = counted.snapshot()
    started = time.perf_counter()
    loop = ClosedLoop(engine, jobs, concurrency, "speculative", limit=requests)
    loop.finished.wait()
    wall = time.perf_counter() - started
    run = counted.since(mark)
    steps = run.steps
    rows_each = [len(s.batch.alphas) + s.plain_beside for s in steps]
    rest = statistics.mean(  # each step's kind (speculative or plain) has its own model
        engine.runner.costs[iteration_costs_name(s.lookahead)].predict(step_rows, 0, 0)
        for s, step_rows in zip(steps, rows_each, strict=True)
    )
    passes = statistics.mean(s.seconds for s in steps) - rest
    plain = sum(s.lookahead == 0 for s in steps) / len(steps)
    switches = sum(before.lookahead == 0 < after.lookahead for before, after in itertools.pairwise(steps))
    outside = wall - sum(s.seconds for s in steps)
    return (
        f"{len(steps)} | {statistics.mean(rows_each):.1f} | {passes * 1e3:.2f} | {rest * 1e3:.2f} "
        f"| {statistics.mean(run.choices) * 1e3:.3f} | {sum(run.choices):.3f}, {run.record_seconds:.3f} "
        f"| {loop.tokens / wall:.0f} | {plain:.0%} | {switches} "
        f"| {run.drafts_fed}, {run.draft_seconds:.2f} | {outside:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="a70")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--loops", type=int, default=1, help="closed loops one after another, one engine")
    parser.add_argument("--policies", nargs="+", default=["fixed_0", "fixed_2", "goodput"])
    parser.add_argument("--models", type=Path, default=Path(".models"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = load_pair(args.pair, args.models)
    jobs = make_workload(pair, 400, seed=7, prompt_range=PROMPT_RANGE)
    print(TABLE_HEADER)
    for policy in args.policies:
        engine = warmed_engine(pair, policy, jobs)
        counted = Counted(engine)
        for loop in range(args.loops):
            row = profile(engine, counted, jobs[10:], args.concurrency, args.requests)
            print(f"| {policy} | {loop + 1} | {row}", flush=True)


if __name__ == "__main__":
    main()
