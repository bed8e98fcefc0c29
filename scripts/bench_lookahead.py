"""Which K policy delivers the most tokens per second: every fixed K, the seed's rule and
the goodput policy against target-only decoding, decided by interleaved repeats.

Pairs: the controlled pairs on the embedded default's shapes (a50, a70, a90: 6-layer
target, 2-layer draft) and the 12-layer controlled pair at α = 0.9 (``a90-12L``, the
decoding benchmark's shapes). Every policy gets its own engine per pair, built and
warmed up (calibration included) before anything is timed, and keeps it across
concurrencies and rounds as a server would. On the CPU every engine computes on one
torch thread (``--threads``), as a served ``cpu`` instance does: with two, each engine's
loop thread keeps an OpenMP team, a dozen teams outnumber the cores, and every small
matmul waits for its workers to wake (on the 2-core VM a steady K = 4 step of a90 took
27 ms against 15.5 ms on one thread, and 16-21 ms for the first three steps after the
relay handed it back, evidence a learning policy takes for what its K costs:
scripts/profile_relay_steps.py).

A round gives every engine, from empty, the round's own fresh workload (that of
scripts/bench_continuous.py: prompts of 16-256 tokens, 60 % of rows 8-32 new tokens,
40 % 96-256; greedy; end-of-sequence off; a new seed each round, so no prompt is served
from the prefix cache of an earlier round) as a closed loop at a fixed concurrency:
each client submits its next request as soon as its previous one ends. A relay lets
one engine step at a time, for a slice of wall time (0.5 s) in an order rotated every
turn, until each has run a warm-up and then a window of its own time; a policy's
tokens/s is what its engine streamed in the window's slices over their seconds. So
every policy runs under the same machine speed however a shared machine drifts.
With ``--requests-per-client`` a round is instead a whole workload: every engine serves
the round's same requests to the end (that many per client, at least 16), and its
tokens/s is all it streamed over all the seconds it held the relay. Every policy then
streams the same tokens, from the same burst of first prompts to the same last rows, so
two runs of the same policy read within a few per cent where windows of a few seconds,
each catching its engine at its own point of the workload, read up to 20 % apart; it
takes several times as long, so it is for head-to-heads on a few cells.
Before its rounds at a concurrency, the policies that learn (the rule, goodput) run
one untimed round of their own. The table gives the median over rounds and the spread.
A plain control runs beside them: K = 0 at every step through the speculative path, the
passes of target-only decoding, so its ratio to target-only in the same rounds says how
far apart two runs of the same work come out, the resolution every other ratio has.

    python scripts/bench_lookahead.py --quick
    python scripts/bench_lookahead.py --out results/bench_lookahead.json   # about 90 min on 2 cores
    python scripts/bench_lookahead.py --pairs a70 --concurrency 1 --log-choices /tmp/steps.json
    python scripts/bench_lookahead.py --pairs a70 --concurrency 32 --compare fixed_1 fixed_2 \
        --rounds 5 --window 6   # a head-to-head: longer windows, fewer competitors
    python scripts/bench_lookahead.py --pairs a70 --concurrency 16 --compare fixed_1 fixed_2 \
        --requests-per-client 4   # a head-to-head on whole workloads: the same tokens for all
    python scripts/bench_lookahead.py --pairs a70 --concurrency 1 4 --compare fixed_2 \
        goodput_passes_only --requests-per-client 4   # what pricing the iteration buys
    python scripts/bench_lookahead.py --pairs a50 --concurrency 4 16 --compare fixed_1 \
        goodput_choice_only --requests-per-client 4 --rounds 5   # what goodput's Ks buy

Prints a markdown table and the targets, writes JSON rows and a PNG; ``--log-choices``
also writes every step goodput was told of (its K, rows, predicted and realised tokens
and seconds) and every choice it made (each K's corrected tokens and seconds, the drafts
lagging and their catch-up), round by round.
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from bench_continuous import Job, make_workload
from bench_gpu import machine
from tqdm import tqdm

from specbatch.decoding import Engine, GenerationRequest, GenerationResult, ModelPair, load_model_pair
from specbatch.decoding.engine import DecodedStep
from specbatch.decoding.lookahead import (
    MAX_LOOKAHEAD,
    BatchShape,
    GoodputLookahead,
    StepOutcome,
    at_measured_acceptance,
)
from specbatch.decoding.rows import RowHandle
from specbatch.decoding.tiny import BENCH_SPEC, CONTROLLED_ALPHAS, TINY_SPEC, build_controlled_pair
from specbatch.figures import save_figure

logger = logging.getLogger("bench_lookahead")

FIXED = tuple(f"fixed_{k}" for k in range(1, MAX_LOOKAHEAD + 1))
# K = 0 every step through the speculative path, no policy: target-only's passes, so its
# ratio to target-only in the same round is what the benchmark cannot resolve (goodput
# running plain can do no better than it)
PLAIN_CONTROL = "fixed_0"
# goodput told only its passes' seconds, as before it priced the engine's iteration around
# each step (6289305): run beside goodput with --compare, what pricing the iteration buys
PASSES_ONLY = "goodput_passes_only"
# goodput pricing every choice and told every step, but K = 0 run and no draft fed: run
# beside goodput with --compare, what its bookkeeping costs apart from the Ks it picks
CHOICE_ONLY = "goodput_choice_only"
ABLATIONS = (PASSES_ONLY, CHOICE_ONLY)
POLICIES = ("target_only", PLAIN_CONTROL, *FIXED, "adaptive_rule", "goodput", *ABLATIONS)
# what goodput is judged against: every fixed K and the rule unless --compare names fewer
COMPARED = (*FIXED, "adaptive_rule")
# the policies whose choice depends on what they have seen
LEARNING = ("adaptive_rule", "goodput", *ABLATIONS)
# name: (shapes, acceptance, time scale). The 12-layer pair's passes cost about three
# times the tiny pair's on a 2-core CPU, so its slices last twice as long.
PAIRS = {
    **{name: (TINY_SPEC, alpha, 1.0) for name, alpha in CONTROLLED_ALPHAS.items()},
    "a90-12L": (BENCH_SPEC, 0.9, 2.0),
}
PROMPT_RANGE = (16, 256)
# Seconds of warm-up per concurrent client, on top of --warm: every run starts from an
# empty engine and a burst of fresh prompts, which takes longer to turn into steady
# decoding the more clients there are (at 32 clients on a50, 2 cores: about 5 s before
# tokens/s levels off).
WARM_PER_CLIENT = 0.2
# Fewest requests a whole-workload round serves (--requests-per-client): at one or four
# clients a few requests per client are a handful, one long answer most of the work.
MIN_REQUESTS = 16


def _lookahead(policy: str) -> int | str:
    if policy == "target_only":
        return 0
    if policy in ABLATIONS:
        return "goodput"
    return int(policy.removeprefix("fixed_")) if policy in (PLAIN_CONTROL, *FIXED) else policy


class PassesOnlyEngine(Engine):
    """The ablation ``goodput_passes_only``: every step's seconds told to the policy are
    its passes' alone, and its iteration cost models learn nothing (they predict 0), as
    before goodput priced the iteration around each step."""

    def _record_step(self, step: DecodedStep, rest: float) -> None:
        super()._record_step(step, 0.0)


class ChoiceOnlyLookahead:
    """The ablation ``goodput_choice_only``: goodput chooses and is told of every step,
    but every step runs K = 0 and no draft is fed while plain."""

    name = "goodput"  # calibrated as goodput is
    k = 0
    feeds_drafts = False

    def __init__(self, policy: GoodputLookahead) -> None:
        self.policy = policy

    def choose(self, batch: BatchShape) -> int:
        self.policy.choose(batch)
        return 0

    def record(self, step: StepOutcome) -> None:
        self.policy.record(step)


def warmed_engine(pair: ModelPair, policy: str, jobs: list[Job]) -> Engine:
    """An engine that has calibrated (goodput) and run a few rows, so no timed window
    pays for set-up."""
    kind = PassesOnlyEngine if policy == PASSES_ONLY else Engine
    engine = kind(pair, lookahead=_lookahead(policy), max_rows=32)
    if policy == CHOICE_ONLY:
        engine.lookahead = ChoiceOnlyLookahead(engine.lookahead)
    mode = "target_only" if policy == "target_only" else "speculative"
    engine.generate([GenerationRequest(j.prompt, max_new_tokens=16) for j in jobs[:4]], mode=mode)
    return engine


class Relay:
    """Lets one engine step at a time, each for a slice of wall time in turn.

    A shared machine's speed drifts by tens of percent over seconds, and a policy
    measured in its own window carries the speed of that window; two identical set-ups
    measured a minute apart differed by up to 11 %. Interleaved in slices of a fraction
    of a second, every policy runs under the same speed, so their ratios resolve a few
    percent. Each engine's step hook waits for the relay; the driver hands it to one
    engine, and after the slice takes it back once that engine's iteration in progress
    has ended (the hook runs at the start of every iteration), so the seconds it held
    the relay cover exactly the steps that delivered its tokens."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holder = ""  # nobody: every engine waits
        self._parked: set[str] = set()

    def gate(self, name: str) -> Callable[[], None]:
        """The step hook of ``name``'s engine."""

        def hook() -> None:
            with self._cond:
                if self._holder == name:
                    return
                self._parked.add(name)
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._holder == name)
                self._parked.discard(name)

        return hook

    def hold(self, name: str, engine: Engine, seconds: float) -> float:
        """Let ``name``'s engine step for ``seconds``; the seconds it held the relay,
        until its last iteration ended (it parked at the hook, or its loop went idle)."""
        return self.alone(name, engine, lambda: time.sleep(seconds))

    def alone(self, name: str, engine: Engine, work: Callable[[], None]) -> float:
        """Let only ``name``'s engine step while ``work`` runs, then take the relay back
        once its iteration in progress has ended; the seconds it held the relay. A round
        ends with each engine winding its rows down alone in turn: engines stepping all
        at once on a shared machine run steps many times their normal length, which a
        policy that learns from its steps' seconds would take as evidence."""
        with self._cond:
            self._holder = name
            self._cond.notify_all()
        started = time.perf_counter()
        work()
        with self._cond:
            self._holder = ""

            def stopped() -> bool:
                thread = engine.loop_thread
                return name in self._parked or thread is None or not thread.is_alive()

            while not self._cond.wait_for(stopped, timeout=0.002):
                pass
        return time.perf_counter() - started


class ClosedLoop:
    """``concurrency`` clients of one engine, each submitting its next request as soon as
    its previous one ends; counts the tokens streamed. Client i serves the workload's
    requests i, i + concurrency, i + 2 * concurrency, ... in order, whatever the timing,
    so every engine of a comparison decodes the same rows side by side: drawn first
    come first served from one list, which requests ran together (and how long a
    round's last rows decoded alone) followed the order earlier rows happened to finish
    in, and two engines of identical passes ran different batches. With a ``limit`` the
    clients serve the first ``limit`` requests between them, and ``finished`` is set when
    the last has ended (otherwise each cycles through its share until stopped)."""

    def __init__(
        self, engine: Engine, jobs: list[Job], concurrency: int, mode: str, limit: int | None = None
    ) -> None:
        self.engine, self.jobs, self.mode = engine, jobs, mode
        self.tokens = 0
        shares = [range(i, len(jobs) if limit is None else limit, concurrency) for i in range(concurrency)]
        self._next_jobs = [itertools.cycle(share) if limit is None else iter(share) for share in shares]
        self._clients_left = concurrency
        self.finished = threading.Event()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._in_flight: dict[int, RowHandle] = {}
        self._threads = [
            threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(concurrency)
        ]
        for thread in self._threads:
            thread.start()

    def on_tokens(self, updates: dict[int, list[int]]) -> None:
        self.tokens += sum(len(tokens) for tokens in updates.values())

    def _client(self, index: int) -> None:
        done = threading.Semaphore(0)
        sink = _ClientSink(self, done)
        try:
            while not self._stop.is_set():
                position = next(self._next_jobs[index], None)
                if position is None:
                    return
                job = self.jobs[position % len(self.jobs)]
                self._in_flight[index] = self.engine.submit(
                    GenerationRequest(job.prompt, max_new_tokens=job.new_tokens), sink, mode=self.mode
                )
                done.acquire()
                self._in_flight.pop(index, None)
        finally:
            with self._lock:
                self._clients_left -= 1
                if not self._clients_left:
                    self.finished.set()

    def stop(self) -> None:
        """End every client, cancelling its row in flight (its engine must hold the relay)."""
        self._stop.set()
        while any(thread.is_alive() for thread in self._threads):
            for handle in list(self._in_flight.values()):
                self.engine.cancel(handle)
            for thread in self._threads:
                thread.join(timeout=0.05)


class _ClientSink:
    """One client's row: its tokens go to the loop's count, its end wakes the client."""

    def __init__(self, loop: ClosedLoop, done: threading.Semaphore) -> None:
        self.loop, self.done = loop, done

    def on_tokens(self, updates: dict[int, list[int]]) -> None:
        self.loop.on_tokens(updates)

    def on_finished(self, key: int, result: GenerationResult) -> None:
        self.done.release()


class ChoiceLog:
    """What goodput was told of every step it ran (``--log-choices``), round by round:
    the K, the rows that ran it and the rows beside them, and the step's predicted
    against its realised tokens and seconds, and when it was recorded (seconds on
    ``clock`` since the log began). A wrong choice shows here as evidence the policy was
    given: a run of slow steps, a K that delivered less than predicted; the times show
    whether slow runs begin where the relay handed the engine back after a pause.

    Every choice is logged too: its K, the rows (their acceptance and tokens left), how
    many of their drafts lag and by how many tokens in all, what catching them all up is
    predicted to cost, and every K's corrected (tokens, seconds) as the policy priced them
    (at the rows' measured acceptance), so a long plain spell shows what kept each K > 0
    out. Pricing the nine Ks again costs about what a choice does, inside goodput's relay
    slices: a logged run is for explaining choices, its goodput figure is charged for the
    log."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.rounds: list[dict] = []
        self._clock = clock
        self._began = clock()

    def start(self, pair: str, concurrency: int, round_index: int) -> None:
        """Steps from now on belong to this round (-1: the learners' untimed round)."""
        self.rounds.append(
            {"pair": pair, "concurrency": concurrency, "round": round_index, "steps": [], "choices": []}
        )

    def attach(self, policy: GoodputLookahead) -> None:
        """Log every choice ``policy`` makes and every step it records, with its own
        prediction of that step."""
        record, choose = policy.record, policy.choose

        def logged_choice(batch: BatchShape) -> int:
            k = choose(batch)
            if self.rounds and batch.alphas:
                self.rounds[-1]["choices"].append(
                    {
                        "k": k,
                        "rows": len(batch.alphas),
                        "alphas": list(batch.alphas),
                        "remaining": list(batch.remaining),
                        "lagging": sum(1 for lag in batch.lags if lag > 0),
                        "lag_tokens": sum(batch.lags),
                        "catch_up_s": policy.catch_up_seconds(batch),
                        "feed_s_per_token": policy.feeds.seconds_per_token,
                        "corrected": [
                            list(s)
                            for s in policy.corrected(at_measured_acceptance(batch), range(MAX_LOOKAHEAD + 1))
                        ],
                        "at": self._clock() - self._began,
                    }
                )
            return k

        def logged(step: StepOutcome) -> None:
            if self.rounds and step.batch.alphas:
                tokens, seconds = policy.predict_step(step)
                self.rounds[-1]["steps"].append(
                    {
                        "k": step.lookahead,
                        "rows": len(step.batch.alphas),
                        "beside": step.plain_beside,
                        "predicted": [tokens, seconds],
                        "realised": [step.committed, step.seconds],
                        "at": self._clock() - self._began,
                    }
                )
            record(step)

        policy.record, policy.choose = logged, logged_choice


def _mean_k(steps: dict[int, int]) -> float:
    total = sum(steps.values())
    return sum(k * n for k, n in steps.items()) / total if total else 0.0


def measure_pair(name: str, pair: ModelPair, args) -> list[dict]:
    engines = {
        policy: warmed_engine(pair, policy, make_workload(pair, 4, seed=11, prompt_range=PROMPT_RANGE))
        for policy in tqdm(_run_policies(args.compare), desc=f"{name} warm-up", leave=False)
    }
    if args.choice_log is not None:
        args.choice_log.attach(engines["goodput"].lookahead)
    # The engines share one process, as no server's would. A full garbage collection
    # walks every engine's objects and runs in whichever engine's thread allocated last,
    # so the policy that allocates most per step (goodput's choice) is charged for
    # walking the others' heaps too. Frozen, the warmed engines' objects are not walked.
    gc.collect()
    gc.freeze()
    try:
        return _measure_concurrencies(name, engines, args)
    finally:
        gc.unfreeze()


def running_in(engines: dict[str, Engine], round_index: int) -> dict[str, Engine]:
    """The engines a round runs: all of them, or in the untimed round (-1) the learners
    among them (``--compare`` may leave the rule out)."""
    return engines if round_index >= 0 else {p: e for p, e in engines.items() if p in LEARNING}


def _measure_concurrencies(name: str, engines: dict[str, Engine], args) -> list[dict]:
    relay = Relay()
    for policy, engine in engines.items():
        engine.step_hook = relay.gate(policy)
    rows = []
    for concurrency in args.concurrency:
        warm = scale_of(name) * (args.warm + WARM_PER_CLIENT * concurrency)
        window = scale_of(name) * args.window
        # round -1 is untimed: the policies that learn meet this batch size before they are timed at it
        for round_index in tqdm(range(-1, args.rounds), desc=f"{name} c={concurrency}", leave=False):
            if args.choice_log is not None:
                args.choice_log.start(name, concurrency, round_index)
            running = running_in(engines, round_index)
            found = relay_round(relay, running, name, concurrency, round_index, warm, window, args)
            rows.extend(found if round_index >= 0 else [])
    return rows


def relay_round(
    relay: Relay,
    engines: dict[str, Engine],
    pair: str,
    concurrency: int,
    round_index: int,
    warm: float,
    window: float,
    args,
) -> list[dict]:
    """Every engine from empty, on the round's own workload, runs a closed loop in
    slices handed round by the relay: for ``warm`` + ``window`` seconds of its own, its
    tokens/s what it streamed in the window's slices over their seconds; or, with
    ``args.requests_per_client``, through the same requests to the end (that many per
    client, at least MIN_REQUESTS), its tokens/s all it streamed over all the seconds it
    held the relay."""
    limit = max(MIN_REQUESTS, args.requests_per_client * concurrency) if args.requests_per_client else None
    model_pair = next(iter(engines.values())).pair
    jobs = make_workload(model_pair, max(400, limit or 0), seed=13 + round_index, prompt_range=PROMPT_RANGE)
    loops = {
        policy: ClosedLoop(
            engine, jobs, concurrency, "target_only" if policy == "target_only" else "speculative", limit
        )
        for policy, engine in engines.items()
    }
    before = {policy: engine.lookahead_steps for policy, engine in engines.items()}
    rotation = round_index * 5 + concurrency
    slice_seconds = args.slice * scale_of(pair)
    if limit is None:
        timed = _windows(relay, engines, loops, rotation, slice_seconds, warm, window)
    else:
        timed = _to_the_end(relay, engines, loops, rotation, slice_seconds)
    for policy, loop in loops.items():
        relay.alone(policy, engines[policy], loop.stop)
    rows = []
    for policy, engine in engines.items():
        after = engine.lookahead_steps
        steps = {k: after.get(k, 0) - before[policy].get(k, 0) for k in after}
        rows.append(
            {
                "pair": pair,
                "concurrency": concurrency,
                "round": round_index,
                "policy": policy,
                "tokens_per_s": timed[policy][1] / timed[policy][0],
                "seconds": timed[policy][0],
                "tokens": timed[policy][1],
                "mean_k": _mean_k(steps),
                "plain_step_fraction": steps.get(0, 0) / max(1, sum(steps.values())),
            }
        )
    return rows


def _windows(
    relay: Relay,
    engines: dict[str, Engine],
    loops: dict[str, ClosedLoop],
    rotation: int,
    slice_seconds: float,
    warm: float,
    window: float,
) -> dict[str, tuple[float, int]]:
    """Each engine's (seconds, tokens) of its window, after ``warm`` seconds of its own."""
    held = dict.fromkeys(engines, 0.0)
    timed = {policy: (0.0, 0) for policy in engines}
    while any(seconds < warm + window for seconds in held.values()):
        for policy in _rotated(list(engines), rotation):
            if held[policy] >= warm + window:
                continue
            limit = warm if held[policy] < warm else warm + window
            tokens = loops[policy].tokens
            seconds = relay.hold(policy, engines[policy], min(slice_seconds, limit - held[policy]))
            if held[policy] >= warm:
                timed[policy] = (timed[policy][0] + seconds, timed[policy][1] + loops[policy].tokens - tokens)
            held[policy] += seconds
        rotation += 1
    return timed


def _to_the_end(
    relay: Relay,
    engines: dict[str, Engine],
    loops: dict[str, ClosedLoop],
    rotation: int,
    slice_seconds: float,
) -> dict[str, tuple[float, int]]:
    """Each engine's (seconds, tokens) of serving its whole workload: the same requests,
    so the same tokens, for every engine. A window of a few seconds catches each engine
    at its own point of the workload (a burst of prompts to prefill, or rows all
    decoding), so two identical engines read apart by that alone; whole workloads do
    not."""
    held = dict.fromkeys(engines, 0.0)
    while not all(loop.finished.is_set() for loop in loops.values()):
        for policy in _rotated(list(engines), rotation):
            finished = loops[policy].finished
            if not finished.is_set():
                held[policy] += relay.alone(
                    policy, engines[policy], functools.partial(finished.wait, slice_seconds)
                )
        rotation += 1
    return {policy: (held[policy], loop.tokens) for policy, loop in loops.items()}


def scale_of(pair: str) -> float:
    """How much longer the pair's slices and windows are than the tiny pairs'."""
    return PAIRS[pair][2]


def _rotated(policies: list[str], shift: int) -> list[str]:
    """Every policy once, starting at ``shift`` (mod their number): no policy always
    follows the same one."""
    shift %= len(policies)
    return policies[shift:] + policies[:shift]


def _rates(rows: list[dict], pair: str, concurrency: int, policy: str) -> list[float]:
    """Tokens/s per round, in round order."""
    chosen = [r for r in rows if (r["pair"], r["concurrency"], r["policy"]) == (pair, concurrency, policy)]
    return [r["tokens_per_s"] for r in sorted(chosen, key=lambda r: r["round"])]


def _run_policies(compared: tuple[str, ...]) -> tuple[str, ...]:
    """Target-only, the plain control and goodput, and the ``compared`` settings beside them."""
    return tuple(p for p in POLICIES if p in ("target_only", PLAIN_CONTROL, "goodput") or p in compared)


def _compared_in(rows: list[dict]) -> tuple[str, ...]:
    """The fixed Ks and rule that ran: goodput's competitors in these rows."""
    ran = {r["policy"] for r in rows}
    return tuple(p for p in COMPARED if p in ran)


def _held_out_best(rows: list[dict], pair: str, concurrency: int, left_out: int) -> str:
    """The fixed K or rule with the highest median over every round but ``left_out``:
    the setting a user who measured those rounds would deploy."""

    def median_kept(policy: str) -> float:
        rates = _rates(rows, pair, concurrency, policy)
        return statistics.median(rate for i, rate in enumerate(rates) if i != left_out)

    return max(_compared_in(rows), key=median_kept)


def cell_summary(rows: list[dict], pair: str, concurrency: int) -> dict:
    """Median tokens/s and spread per policy; goodput's median per-round ratios to
    target-only and to the best other policy (the one with the highest median).

    The best of nine noisy medians is picked on the rounds it is then scored on, so it
    carries their luck (the winner's curse): where several Ks tie, even a policy that
    always ran the truly best K would score under 1.0x against it. So the cell also
    gives the leave-one-round-out ratio: in each round, goodput against the setting
    that measured best in the other rounds (what a user deploying the best measured
    fixed K gets), and that setting's own ratio to the in-sample best."""
    ran = _run_policies(tuple({r["policy"] for r in rows}))
    medians = {p: statistics.median(_rates(rows, pair, concurrency, p)) for p in ran}
    best_other = max(_compared_in(rows), key=medians.__getitem__)
    goodput = _rates(rows, pair, concurrency, "goodput")

    def ratio(policy: str, of: str = "goodput") -> float:
        rates = _rates(rows, pair, concurrency, of)
        return statistics.median(
            g / o for g, o in zip(rates, _rates(rows, pair, concurrency, policy), strict=True)
        )

    held_out = [_held_out_best(rows, pair, concurrency, i) for i in range(len(goodput))]
    best_rates = _rates(rows, pair, concurrency, best_other)
    mean_k = statistics.median(
        r["mean_k"]
        for r in rows
        if (r["pair"], r["concurrency"], r["policy"]) == (pair, concurrency, "goodput")
    )
    return {
        "pair": pair,
        "concurrency": concurrency,
        "medians": medians,
        "spreads": {p: (min(v), max(v)) for p in ran for v in [_rates(rows, pair, concurrency, p)]},
        "best_other": best_other,
        "goodput_vs_target_only": ratio("target_only"),
        "control_vs_target_only": ratio("target_only", of=PLAIN_CONTROL),
        "goodput_vs_best": ratio(best_other),
        "held_out_best": held_out,
        "goodput_vs_held_out_best": statistics.median(
            goodput[i] / _rates(rows, pair, concurrency, h)[i] for i, h in enumerate(held_out)
        ),
        "held_out_best_vs_best": statistics.median(
            _rates(rows, pair, concurrency, h)[i] / best_rates[i] for i, h in enumerate(held_out)
        ),
        "goodput_mean_k": mean_k,
        "goodput_vs_passes_only": ratio(PASSES_ONLY) if PASSES_ONLY in ran else None,
        "goodput_vs_choice_only": ratio(CHOICE_ONLY) if CHOICE_ONLY in ran else None,
        "choice_only_vs_control": ratio(PLAIN_CONTROL, of=CHOICE_ONLY) if CHOICE_ONLY in ran else None,
    }


def table(cells: list[dict]) -> str:
    lines = [
        "| pair | c | target-only tok/s | best fixed K / rule (tok/s) | goodput tok/s (min-max) "
        "| goodput mean K | goodput / target-only | goodput / best "
        "| goodput / best of the other rounds | best of the other rounds / best "
        "| plain control / target-only |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        low, high = c["spreads"]["goodput"]
        best = c["best_other"].removeprefix("fixed_").replace("adaptive_rule", "rule")
        lines.append(
            f"| {c['pair']} | {c['concurrency']} | {c['medians']['target_only']:.0f} "
            f"| K={best} ({c['medians'][c['best_other']]:.0f}) "
            f"| {c['medians']['goodput']:.0f} ({low:.0f}-{high:.0f}) | {c['goodput_mean_k']:.1f} "
            f"| {c['goodput_vs_target_only']:.2f}x | {c['goodput_vs_best']:.2f}x "
            f"| {c['goodput_vs_held_out_best']:.2f}x | {c['held_out_best_vs_best']:.2f}x "
            f"| {c['control_vs_target_only']:.2f}x |"
        )
    return "\n".join(lines).replace("K=rule", "rule")


def policy_table(cells: list[dict]) -> str:
    """Every policy's median tokens/s over target-only's."""
    ran = [p for p in POLICIES[1:] if p in cells[0]["medians"]]
    lines = ["| pair | c | " + " | ".join(p.replace("fixed_", "K=") for p in ran) + " |"]
    lines.append("|---|---|" + "---|" * len(ran))
    for c in cells:
        base = c["medians"]["target_only"]
        lines.append(
            f"| {c['pair']} | {c['concurrency']} | "
            + " | ".join(f"{c['medians'][p] / base:.2f}" for p in ran)
            + " |"
        )
    return "\n".join(lines)


def verdicts(cells: list[dict], compared: tuple[str, ...] = COMPARED) -> list[str]:
    """The targets' verdicts; "best" is the best of ``compared`` (what ran beside goodput)."""
    best_of = "the best fixed K or rule" if compared == COMPARED else f"the best of {', '.join(compared)}"
    worst_plain = min(cells, key=lambda c: c["goodput_vs_target_only"])
    worst_best = min(cells, key=lambda c: c["goodput_vs_best"])
    worst_held = min(cells, key=lambda c: c["goodput_vs_held_out_best"])
    out = [
        f"goodput >= 0.97x target-only everywhere: worst {worst_plain['goodput_vs_target_only']:.2f}x "
        f"({worst_plain['pair']}, c={worst_plain['concurrency']})",
        f"goodput >= 0.97x {best_of} everywhere: worst {worst_best['goodput_vs_best']:.2f}x "
        f"({worst_best['pair']}, c={worst_best['concurrency']}, best {worst_best['best_other']}); "
        f"missed in {sum(c['goodput_vs_best'] < 0.97 for c in cells)} of {len(cells)} cells",
        f"against the best of the other rounds: worst {worst_held['goodput_vs_held_out_best']:.2f}x "
        f"({worst_held['pair']}, c={worst_held['concurrency']}); under 0.97x in "
        f"{sum(c['goodput_vs_held_out_best'] < 0.97 for c in cells)} of {len(cells)} cells",
    ]
    controls = [c["control_vs_target_only"] for c in cells]
    out.append(
        f"plain control (K = 0 through the speculative path) / target-only: {min(controls):.2f}-"
        f"{max(controls):.2f}x, outside 0.97-1.03x in {sum(abs(x - 1) > 0.03 for x in controls)} of "
        f"{len(cells)} cells (the same passes: what these medians cannot resolve)"
    )
    if all(c["goodput_vs_passes_only"] is not None for c in cells):
        out.append(
            f"goodput / {PASSES_ONLY} (what pricing the iteration buys), median per-round ratio: "
            + ", ".join(f"{c['pair']} c={c['concurrency']} {c['goodput_vs_passes_only']:.2f}x" for c in cells)
        )
    if all(c["goodput_vs_choice_only"] is not None for c in cells):
        out.append(
            f"goodput / {CHOICE_ONLY} (what its Ks buy) and {CHOICE_ONLY} / plain control (what its "
            "bookkeeping costs), median per-round ratios: "
            + ", ".join(
                f"{c['pair']} c={c['concurrency']} {c['goodput_vs_choice_only']:.2f}x and "
                f"{c['choice_only_vs_control']:.2f}x"
                for c in cells
            )
        )
    for pair, target in (("a90", 1.15), ("a90-12L", 1.4)):
        cell = next((c for c in cells if (c["pair"], c["concurrency"]) == (pair, 1)), None)
        if cell:
            out.append(
                f"{pair} at c=1: goodput {cell['goodput_vs_target_only']:.2f}x target-only "
                f"(target >= {target}x)"
            )
    return out


def plot(cells: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = list(dict.fromkeys(c["pair"] for c in cells))
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.2 * len(pairs), 3.8), sharey=True, squeeze=False)
    for ax, pair in zip(axes[0], pairs, strict=True):
        mine = [c for c in cells if c["pair"] == pair]
        xs = [c["concurrency"] for c in mine]
        for policy in (p for p in FIXED if p in mine[0]["medians"]):
            ax.plot(
                xs, [c["medians"][policy] / c["medians"]["target_only"] for c in mine], color="0.8", lw=0.8
            )
        if "adaptive_rule" in mine[0]["medians"]:
            ax.plot(
                xs,
                [c["medians"]["adaptive_rule"] / c["medians"]["target_only"] for c in mine],
                "x--",
                color="C0",
                label="rule",
            )
        ax.plot(
            xs,
            [c["medians"][c["best_other"]] / c["medians"]["target_only"] for c in mine],
            "s:",
            color="C1",
            label="best fixed K / rule",
        )
        # every line the same statistic (median tokens/s over target-only's median): the
        # table's per-round ratios can differ from it where target-only's rate swings
        ax.plot(
            xs,
            [c["medians"]["goodput"] / c["medians"]["target_only"] for c in mine],
            "o-",
            lw=2,
            color="C2",
            label="goodput",
        )
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        fixed = [p.removeprefix("fixed_") for p in FIXED if p in mine[0]["medians"]]
        ax.set_title(f"{pair} (K = {', '.join(fixed)})" if fixed else pair)
        ax.set_xlabel("concurrency (closed loop)")
    axes[0][0].set_ylabel("tokens/s over target-only (median)")
    axes[0][0].legend(fontsize=7, title="grey: the fixed Ks in the title", title_fontsize=7)
    save_figure(fig, path, dpi=110)


def load_pair(name: str, models: Path, device: str = "cpu") -> ModelPair:
    spec, alpha, _ = PAIRS[name]
    directory = (
        models / ("controlled_bench" if spec is BENCH_SPEC else "controlled_tiny") / name.split("-")[0]
    )
    target, draft = build_controlled_pair(directory, spec, alpha)
    pair = load_model_pair(str(target), str(draft), device=device)
    pair.eos_token_ids.clear()  # every row runs its full budget
    return pair


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="a50 and a90, c = 1 and 32, 2 rounds (about 9 min)"
    )
    parser.add_argument(
        "--models", type=Path, default=Path(".models"), help="root of controlled_tiny/, controlled_bench/"
    )
    parser.add_argument("--pairs", nargs="+", choices=sorted(PAIRS), default=None)
    parser.add_argument("--concurrency", nargs="+", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None, help="repeats of every policy (default 3)")
    parser.add_argument(
        "--warm", type=float, default=None, help="seconds of each run before the window (+0.04 s per client)"
    )
    parser.add_argument("--window", type=float, default=None, help="seconds of each run's window")
    parser.add_argument(
        "--slice", type=float, default=0.5, help="seconds an engine holds the relay at a time"
    )
    parser.add_argument(
        "--requests-per-client",
        type=int,
        default=None,
        help="instead of windows, every engine serves the round's same requests to the end, this "
        f"many per client and at least {MIN_REQUESTS} (--warm and --window unused): the same "
        "tokens for every policy, so two runs of the same policy read within a few per cent",
    )
    parser.add_argument(
        "--compare",
        nargs="+",
        choices=(*COMPARED, *ABLATIONS),
        default=COMPARED,
        help="the fixed Ks and rule goodput is judged against (default all): fewer engines per "
        "round leave time for longer windows and more rounds in a head-to-head on a few cells; "
        f"{PASSES_ONLY} and {CHOICE_ONLY} run those ablations beside them (never counted as the best)",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (bfloat16 on a GPU)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads on the CPU (default 1, the served `cpu` config's); more puts one "
        "OpenMP team per engine in this process, which no served instance runs beside",
    )
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--plot", type=Path, default=Path("docs/img/bench_lookahead.png"))
    parser.add_argument(
        "--log-choices",
        type=Path,
        help="write every choice goodput made (each K's corrected rate) and every step it recorded, "
        "round by round, as JSON here; the log's pricing is charged to goodput's slices",
    )
    args = parser.parse_args()
    args.choice_log = ChoiceLog() if args.log_choices else None
    args.pairs = args.pairs or (["a50", "a90"] if args.quick else list(PAIRS))
    args.concurrency = args.concurrency or ([1, 32] if args.quick else [1, 4, 16, 32])
    args.rounds = args.rounds or (2 if args.quick else 3)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: each round's best is judged on the others")
    args.warm = args.warm if args.warm is not None else 0.4
    args.window = args.window if args.window is not None else (1.0 if args.quick else 3.0)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("specbatch").setLevel(logging.WARNING)
    torch.manual_seed(0)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)

    started = time.perf_counter()
    rows: list[dict] = []
    for name in tqdm(args.pairs, desc="pairs"):
        rows.extend(measure_pair(name, load_pair(name, args.models, args.device), args))
    cells = [cell_summary(rows, p, c) for p in args.pairs for c in args.concurrency]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    rounds = (
        f"{args.requests_per_client} requests per client served to the end"
        if args.requests_per_client
        else f"{args.warm:.1f} s + {WARM_PER_CLIENT} s per client + {args.window:.1f} s windows"
    )
    print(
        f"\n## K policies, closed loop ({'quick' if args.quick else 'full'}, commit {commit}, "
        f"{machine(args.device)}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, "
        f"{args.rounds} rounds of {rounds} in {args.slice:.2f} s slices (all twice as long on a90-12L), "
        f"{time.perf_counter() - started:.0f} s)\n"
    )
    compared = tuple(p for p in args.compare if p in COMPARED)
    if compared != COMPARED:
        print(f"goodput judged against {', '.join(compared)} only: 'best' is the best of these\n")
    print(table(cells))
    print()
    print(policy_table(cells))
    print("\n" + "\n".join(f"- {line}" for line in verdicts(cells, compared)))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows, "cells": cells}, indent=2) + "\n")
    if args.choice_log is not None:
        args.log_choices.parent.mkdir(parents=True, exist_ok=True)
        args.log_choices.write_text(json.dumps(args.choice_log.rounds) + "\n")
    plot(cells, args.plot)
    print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
