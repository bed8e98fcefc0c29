"""Admission policies against the peers a user would pick, tuned, on a real tritonserver.

Every set-up serves the same open-loop Poisson arrivals (same prompts, same max_tokens,
same arrival times) over one gRPC stream:

  (a) least_slack      the specbatch ensemble: its scheduler admits per instance (least
                       slack first, min(b_mem, b_SLA) rows, capacity-sized queue, deadline
                       shedding) over continuous-batching instances
  (b) fcfs             the same instances, first-come first-served, no bins, no SLA cap,
                       no queue bound (vLLM's policy)
  (d) shortest_first   the same instances, shortest predicted output first, blind to SLAs
  (c) triton_batching  qwen3_specdec called directly, static batches formed by Triton's
                       dynamic_batching, each request answered as soon as its rows end; at
                       the best setting of a sweep of max batch size {4, 8, 16, 32} x queue
                       delay {5, 20, 50 ms}, run at the capacity of the shipped setting
  ablations of (a)     without b_SLA, b_SLA at the fixed per-token allowance, or at
                       the pace its running rows afford wherever one row alone runs,
                       refusing a request only for its own SLA (not for a queued
                       prompt's it would break), held to b_SLA's rows (no prompt
                       started beside running rows with slack to spare), late rows
                       steered to twice their budget (not 1.5 times), without
                       b_mem, without deadline shedding, one bin, length-affine
                       placement

Workloads: `infobench` (infobench prompts, 60 % asking 8-32 tokens, the rest 96-192),
`mixed` (the router's default graph/mmlu/infobench mix, sent through the ensemble as
users send it, no task_override; (c) has no router: each prompt is a generation of
max_tokens, as a Triton user without the router would send it), `heavy` (infobench with
10 % of prompts asking 512 tokens) and `memory` (a KV budget small enough that first-come
batching preempts, long outputs; (a) and (b) only, preemptions from the scheduler's
`specbatch_preemptions` gauges). Ablations run on `infobench`, and on another workload
where --only names them.

The capacity of a set-up is the highest rate it keeps up with: a probe overloads it
first (its completions per second under overload), then that rate is offered again and
raised while the set-up keeps up (refuses at most 5 %, its work done within the longest
SLA after the last arrival, its last arrivals no later against their SLA than its
first); loads are multiples of (c)'s capacity (in `memory`: 1.0, 1.5 and 2.0x (b)'s),
measured in the same run, and `mixed` also runs (a) at 2x its own capacity
(prompt-heavy overload; the ablations of (a) named with --only at the same rate). One
tritonserver per set-up and workload serves a warm-up and its capacity probe; a fresh
one, warmed the same way, serves the loads in ascending order. With --rounds N every
cell runs N times on fresh arrivals (the same for every set-up in a round), round by
round with every set-up's server up and their order rotated each round, so that the
shared machine's slow spells fall on all set-ups alike; a target is then the median of
its N per-round ratios, reported with each round's. A request meets its SLA when its
first token comes within --sla-ttft-s and it ends within --sla-base-s + --sla-per-token-s x
max_tokens; goodput is requests meeting it per second. The scheduler is told that SLA
(`sla_ttft_ms`, `sla_finish_base_ms`, `sla_finish_per_token_ms`), as a user holding it
to one would tell it; Triton's batcher has no such setting. Writes JSON, a PNG per workload
and markdown tables (stdout and --markdown).

    .venv/bin/python scripts/bench_policies.py --quick   # CI size, about 30 minutes on 2 cores
    .venv/bin/python scripts/bench_policies.py           # full size, about an hour
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import queue
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from specbatch.figures import save_figure  # noqa: E402
from specbatch.routing import build_infobench_prompt, generate_workload  # noqa: E402
from specbatch.server.launcher import ensure_tiny_models  # noqa: E402
from specbatch.server.ports import Ports  # noqa: E402
from specbatch.server.process import ServerOptions, TritonProcess  # noqa: E402

logger = logging.getLogger("bench_policies")


@dataclass(frozen=True)
class TimedRequest:
    at_s: float
    prompt: str
    max_tokens: int
    task_override: str | None = "infobench"  # None: the router decides, as for a user


@dataclass(frozen=True)
class Setup:
    name: str
    label: str
    options: dict


UNBOUNDED = {"SPECBATCH_QUEUE_LIMIT": "1000000"}
TRITON_BATCHING = Setup(
    "triton_batching",
    "(c) Triton dynamic_batching",
    {"only_model": "qwen3_specdec", "config_name": "cpu_triton_batching"},
)
PEERS = (
    Setup("least_slack", "(a) specbatch (least slack)", {}),
    Setup("fcfs", "(b) first-come continuous", {"env": {"SPECBATCH_ADMISSION": "fcfs", **UNBOUNDED}}),
    Setup(
        "shortest_first",
        "(d) shortest predicted first",
        {"env": {"SPECBATCH_ADMISSION": "shortest_first", **UNBOUNDED}},
    ),
    TRITON_BATCHING,
)
ABLATIONS = (
    Setup("no_b_sla", "(a) without b_SLA", {"env": {"SPECBATCH_B_SLA": "off"}}),
    Setup("fixed_pace", "(a) b_SLA at the fixed allowance", {"env": {"SPECBATCH_B_SLA_PACE": "allowance"}}),
    Setup("slack_pace", "(a) b_SLA at its rows' pace", {"env": {"SPECBATCH_B_SLA_PACE": "slack"}}),
    Setup(
        "allowance_in_reach",
        "(a) b_SLA at the allowance while one row reaches it (the default before 2026-12-05)",
        {"env": {"SPECBATCH_B_SLA_PACE": "allowance_in_reach"}},
    ),
    Setup(
        "late_twice",
        "(a) late rows steered to twice their budget",
        {"env": {"SPECBATCH_SLA_LATE_BUDGETS": "2"}},
    ),
    Setup(
        "break_promises",
        "(a) refusing only for the newcomer's own SLA",
        {"env": {"SPECBATCH_KEEP_PROMISES": "off"}},
    ),
    Setup(
        "held_to_b_sla",
        "(a) without starting prompts beside running rows",
        {"env": {"SPECBATCH_START_BESIDE": "off"}},
    ),
    Setup(
        "cautious_pace",
        "(a) rows priced at the slowest pace of 64 steps, starts beside at the slowdown",
        {"env": {"SPECBATCH_PACE_WINDOW_STEPS": "64", "SPECBATCH_BESIDE_SLOWDOWN": "on"}},
    ),
    Setup("no_b_mem", "(a) without b_mem", {"env": {"SPECBATCH_B_MEM": "off"}}),
    Setup("kv_peak", "(a) b_mem at the rows' peak", {"env": {"SPECBATCH_KV_RESERVATION": "peak"}}),
    Setup("no_shedding", "(a) without deadline shedding", {"env": {"SPECBATCH_DEADLINE_SHEDDING": "off"}}),
    Setup("one_bin", "(a) without bins (num_bins 1)", {"env": {"SPECBATCH_NUM_BINS": "1"}}),
    Setup(
        "length_affine",
        "(a) length-affine placement",
        {"env": {"SPECBATCH_PLACEMENT": "length_affine"}},
    ),
    Setup(
        "cut_rows_skipped",
        "(a) lengths learned from rows that ended by themselves only",
        {"env": {"SPECBATCH_LENGTH_CUT_ROWS": "skipped"}},
    ),
)
SETUPS = PEERS + ABLATIONS
LOADS = (0.8, 1.0, 1.2)
SWEEP_BATCH = (4, 8, 16, 32)
SWEEP_DELAY_MS = (5, 20, 50)
SHIPPED = (8, 20)  # configs/cpu_triton_batching.pbtxt
PROMPT_HEAVY_LOAD = 2.0  # the prompt-heavy overload: mixed profile at this multiple of (a)'s capacity
REFUSED_AT_ONCE_S = 0.5  # a refusal later than this is not "at once"
REFUSED_KEEPING_UP = 0.05  # a capacity probe refusing at most this share of its requests keeps up
# a probe refusing more is saturated unless it completed this many times what the probe at
# half its rate did: completions still rising with the offered rate are not a plateau
PLATEAU_GAIN = 1.25
# the sustained rate: searched upward from the completions under overload in steps of this
# factor, at most SUSTAINED_STEPS probes
SUSTAINED_STEP = 1.25
SUSTAINED_STEPS = 3
# a probe keeps up while the lateness (end to end over SLA) of its last third of arrivals
# stays within this factor, plus LATENESS_SLACK, of its first third's: a queue that grows
# over the probe shows as lateness that grows with the arrival time
LATENESS_GROWTH = 1.5
LATENESS_SLACK = 0.1
OVERLOAD_SEED_OFFSET = 3  # the overload's arrivals: seed + 3 (probes + 1, (c)'s sweep + 2)
ROUND_SEED_STRIDE = 100  # round r's arrivals: seed + 100 r, clear of those offsets
QUICK = {"duration": 12.0, "sweep_duration": 8.0, "capacity_probe_s": 10.0, "drain": 90.0}
FULL = {"duration": 25.0, "sweep_duration": 15.0, "capacity_probe_s": 15.0, "drain": 150.0}


def poisson_times(rate: float, duration_s: float, rng: random.Random) -> list[float]:
    """Arrival times of a Poisson stream at ``rate`` per second over ``duration_s``."""
    times, now = [], 0.0
    while True:
        now += rng.expovariate(rate)
        if now >= duration_s:
            return times
        times.append(now)


def build_workload(
    rate: float,
    duration_s: float,
    seed: int,
    short_share: float,
    long_share: float = 0.0,
    long_tokens: int = 512,
    medium: tuple[int, int] = (96, 192),
) -> list[TimedRequest]:
    """Poisson arrivals of infobench prompts; max_tokens bimodal (many short answers, some
    long ones), with ``long_share`` of them asking ``long_tokens`` (the heavy tail)."""
    rng = random.Random(seed)
    times = poisson_times(rate, duration_s, rng)
    prompts = [p.text for p in generate_workload(len(times), seed, mix={"infobench": 1.0})]
    requests = []
    for t, p in zip(times, prompts, strict=True):
        draw = rng.random()
        if draw < long_share:
            tokens = long_tokens
        elif draw < long_share + (1 - long_share) * short_share:
            tokens = rng.randint(8, 32)
        else:
            tokens = rng.randint(*medium)
        requests.append(TimedRequest(t, build_infobench_prompt(p), tokens))
    return requests


def build_mixed_workload(rate: float, duration_s: float, seed: int, short_share: float) -> list[TimedRequest]:
    """Poisson arrivals of the router's default graph/mmlu/infobench mix, as users send
    them (no task override); max_tokens drawn as in build_workload."""
    rng = random.Random(seed)
    times = poisson_times(rate, duration_s, rng)
    prompts = generate_workload(len(times), seed)
    return [
        TimedRequest(
            t,
            p.text,
            rng.randint(8, 32) if rng.random() < short_share else rng.randint(96, 192),
            task_override=None,
        )
        for t, p in zip(times, prompts, strict=True)
    ]


@dataclass(frozen=True)
class ServedWorkload:
    name: str
    title: str
    build: Callable[[float, float, int], list[TimedRequest]]
    setups: tuple[Setup, ...]
    reference: str  # the set-up whose capacity the loads are multiples of
    env: dict = field(default_factory=dict)
    overload: bool = False
    loads: tuple[float, ...] | None = None  # else --loads


def workloads(args: argparse.Namespace) -> list[ServedWorkload]:
    short = args.short_share
    ensemble = tuple(s for s in PEERS if s.name != "triton_batching")
    return [
        ServedWorkload(
            "infobench",
            "infobench prompts, 60 % asking 8-32 tokens, 40 % 96-192",
            lambda rate, d, seed: build_workload(rate, d, seed, short),
            (TRITON_BATCHING, *ensemble, *ABLATIONS),
            args.load_reference,
        ),
        ServedWorkload(
            "mixed",
            "graph/mmlu/infobench mix through the router, max_tokens as infobench",
            lambda rate, d, seed: build_mixed_workload(rate, d, seed, short),
            (TRITON_BATCHING, *ensemble),
            args.load_reference,
            overload=True,
        ),
        ServedWorkload(
            "heavy",
            "infobench, heavy tail: 10 % of prompts asking 512 tokens",
            lambda rate, d, seed: build_workload(rate, d, seed, short, long_share=0.1),
            (TRITON_BATCHING, *ensemble),
            args.load_reference,
        ),
        ServedWorkload(
            "memory",
            f"memory-bound: KV budget {args.memory_budget_gb:g} GB per instance, "
            "half the prompts asking 384 tokens, the rest 96-192",
            lambda rate, d, seed: build_workload(rate, d, seed, 0.0, long_share=0.5, long_tokens=384),
            (ensemble[1], ensemble[0]),
            "fcfs",
            env={"SPECBATCH_KV_MEMORY_BUDGET_GB": f"{args.memory_budget_gb:g}"},
            loads=tuple(args.memory_loads),
        ),
    ]


def request_inputs(grpcclient, setup: Setup, arrival: TimedRequest) -> tuple[str, list]:
    def tensor(name: str, array: np.ndarray, datatype: str):
        value = grpcclient.InferInput(name, list(array.shape), datatype)
        value.set_data_from_numpy(array)
        return value

    if setup.name == "triton_batching":
        return "qwen3_specdec", [
            tensor("mode", np.array([[b"speculative"]], dtype=np.object_), "BYTES"),
            tensor("prompt", np.array([[arrival.prompt.encode()]], dtype=np.object_), "BYTES"),
            tensor("max_tokens", np.array([[arrival.max_tokens]], dtype=np.int32), "INT32"),
        ]
    inputs = [
        tensor("text_input", np.array([[arrival.prompt.encode()]], dtype=np.object_), "BYTES"),
        tensor("max_tokens", np.array([[arrival.max_tokens]], dtype=np.int32), "INT32"),
        tensor("stream", np.array([[True]]), "BOOL"),
    ]
    if arrival.task_override is not None:
        override = np.array([[arrival.task_override.encode()]], dtype=np.object_)
        inputs.append(tensor("task_override", override, "BYTES"))
    return "specbatch", inputs


def drive(url: str, setup: Setup, arrivals: list[TimedRequest], timeout_s: float) -> list[dict]:
    """Send every arrival on time over one gRPC stream; one record per request, from its
    first response (first token) and its final one. An error reply is a record with id
    None and the second it came (`error_s`)."""
    import tritonclient.grpc as grpcclient

    replies: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: replies.put((time.monotonic(), result, error)))
    sent: dict[str, float] = {}
    first: dict[str, float] = {}
    start = time.monotonic()

    def sender() -> None:
        for index, arrival in enumerate(arrivals):
            delay = start + arrival.at_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            model, inputs = request_inputs(grpcclient, setup, arrival)
            sent[str(index)] = time.monotonic()
            client.async_stream_infer(model, inputs, request_id=str(index))

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    records: list[dict] = []
    deadline = start + arrivals[-1].at_s + timeout_s
    while len(records) < len(arrivals) and time.monotonic() < deadline:
        try:
            at, result, error = replies.get(timeout=1.0)
        except queue.Empty:
            continue
        if error is not None:
            records.append({"id": None, "error": str(error), "error_s": at - start})
            continue
        response = result.get_response()
        final = "triton_final_response" not in response.parameters or (
            response.parameters["triton_final_response"].bool_param
        )
        first.setdefault(response.id, at)
        if not final:
            continue
        instance = result.as_numpy("model_instance")  # the ensemble's output, not qwen3_specdec's
        records.append(
            {
                "id": int(response.id),
                "ttft_s": first[response.id] - sent[response.id],
                "e2e_s": at - sent[response.id],
                "output_tokens": int(result.as_numpy("num_output_tokens").reshape(-1)[0]),
                "input_tokens": int(result.as_numpy("num_input_tokens").reshape(-1)[0]),
                "instance": "" if instance is None else instance.reshape(-1)[0].decode(),
                "first_s": first[response.id] - start,
                "done_s": at - start,
                "error": "",
            }
        )
    thread.join(timeout=5)
    client.stop_stream()
    client.close()
    return records


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def e2e_sla_s(arrival: TimedRequest, args: argparse.Namespace) -> float:
    return args.sla_base_s + args.sla_per_token_s * arrival.max_tokens


def meets_sla(ttft_s: float, e2e_s: float, arrival: TimedRequest, args: argparse.Namespace) -> bool:
    """First token within --sla-ttft-s, last within the arrival's end-to-end SLA."""
    return ttft_s <= args.sla_ttft_s and e2e_s <= e2e_sla_s(arrival, args)


def refusal_delays(arrivals: list[TimedRequest], records: list[dict]) -> list[float]:
    """Seconds from sending a refused request to its error. The error reply carries no
    request id here, so the k-th error is matched to the k-th request (in arrival order)
    that got no answer: refusals are decided at submission, in arrival order."""
    answered = {r["id"] for r in records if r["id"] is not None}
    unanswered = [i for i in range(len(arrivals)) if i not in answered]
    errors = sorted(r["error_s"] for r in records if r["id"] is None)
    return [at - arrivals[i].at_s for i, at in zip(unanswered, errors, strict=False)]


def summarise(
    setup: Setup, rate: float, arrivals: list[TimedRequest], records: list[dict], args: argparse.Namespace
) -> dict:
    """One row of the tables; ``latest`` keeps the five answers latest against their SLA."""
    served = [r for r in records if r["id"] is not None]

    def lateness(record: dict) -> float:
        return record["e2e_s"] / e2e_sla_s(arrivals[record["id"]], args)

    span = max([arrivals[-1].at_s] + [r["done_s"] for r in served])
    thirds = [[lateness(r) for r in served if r["id"] * 3 // len(arrivals) == third] for third in (0, 2)]
    met = [r for r in served if meets_sla(r["ttft_s"], r["e2e_s"], arrivals[r["id"]], args)]
    refusals = refusal_delays(arrivals, records)
    return {
        "setup": setup.name,
        "label": setup.label,
        "rate": rate,
        "offered": len(arrivals),
        "completed": len(served),
        "errors": len(records) - len(served),
        "lost": len(arrivals) - len(records),
        "span_s": span,
        "throughput_rps": len(served) / span,
        "goodput_rps": len(met) / span,
        # every request meeting its SLA: no set-up's goodput can pass it (span >= last arrival)
        "goodput_ceiling_rps": len(arrivals) / arrivals[-1].at_s,
        "sla_met": len(met) / len(arrivals),
        "ttft_p95_s": percentile([r["ttft_s"] for r in served], 95),
        "e2e_p99_s": percentile([r["e2e_s"] for r in served], 99),
        "e2e_over_sla_p99": percentile([lateness(r) for r in served], 99),
        "lateness_first_third": percentile(thirds[0], 50),
        "lateness_last_third": percentile(thirds[1], 50),
        "refusal_p99_s": percentile(refusals, 99),
        "input_tokens": sum(r["input_tokens"] for r in served),
        "first_error": next((r["error"] for r in records if r["id"] is None), ""),
        "latest": [latest_record(r, arrivals[r["id"]], args) for r in sorted(served, key=lateness)[-5:]],
        "by_length": by_length(arrivals, served, met),
    }


LENGTH_CLASSES = ((0, 32, "<= 32 tokens"), (33, 192, "33-192 tokens"), (193, 1 << 30, "> 192 tokens"))


def by_length(arrivals: list[TimedRequest], served: list[dict], met: list[dict]) -> dict[str, dict]:
    """Offered, refused and SLA-met requests per class of max_tokens: where a set-up wins
    or loses its goodput (short prompts refused, long ones served late, ...)."""
    served_ids = {r["id"] for r in served}
    met_ids = {r["id"] for r in met}
    classes = {}
    for low, high, label in LENGTH_CLASSES:
        ids = [i for i, arrival in enumerate(arrivals) if low <= arrival.max_tokens <= high]
        if ids:
            classes[label] = {
                "offered": len(ids),
                "refused": sum(i not in served_ids for i in ids),
                "met": sum(i in met_ids for i in ids),
            }
    return classes


def latest_record(record: dict, arrival: TimedRequest, args: argparse.Namespace) -> dict:
    """What a late answer was: its prompt's start, its sizes, its SLA and its times."""
    keys = ("ttft_s", "e2e_s", "input_tokens", "output_tokens", "instance")
    return {
        "prompt": arrival.prompt[:60],
        "max_tokens": arrival.max_tokens,
        "sla_s": e2e_sla_s(arrival, args),
        "arrival_s": arrival.at_s,
        **{key: record[key] for key in keys},
    }


def cpu_seconds(process: TritonProcess, prefixes: tuple[str, ...] = ("router_", "scheduler_")) -> float:
    """User + system CPU seconds so far of the server's router and scheduler processes."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for name, pid in process.stub_pids().items():
        if name.startswith(prefixes):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


ENGINE_METRICS = (
    "specbatch_preemptions",
    "specbatch_prefix_hit_tokens_total",
    "specbatch_prefix_miss_tokens_total",
    "specbatch_step_seconds_total",
    "specbatch_cycle_seconds_total",
    "specbatch_lookahead_steps_total",  # summed over K: decode steps
    "specbatch_row_step_tokens_total",  # summed over tokens: row-steps
    "specbatch_lookahead_cut_for_kv_total",
)
ROW_TOKENS = "row_tokens"  # tokens committed by rows: the row-step histogram weighted by its label
STEPS_BY_K = "steps_by_k"  # decode steps per K run, keyed steps_by_k|K
# the committing steps per batch-size bucket (label rows): what each figure of a row's
# engine["by_batch"][rows] is read from
BATCH_METRICS = {
    "specbatch_batch_steps_total": "steps",
    "specbatch_batch_row_steps_total": "row_steps",
    "specbatch_batch_tokens_total": "tokens",
    "specbatch_batch_prefill_tokens_total": "prefill_tokens",
    "specbatch_batch_step_seconds_total": "seconds",
    "specbatch_batch_decode_steps_total": "decode_steps",
    "specbatch_batch_decode_step_seconds_total": "decode_seconds",
    "specbatch_batch_decode_step_seconds_squared_total": "decode_seconds_squared",
    "specbatch_batch_context_slots_total": "context_slots",
}


def engine_metrics(url: str) -> dict[str, float]:
    """The scheduler's per-instance engine figures, summed over instances (the per-batch
    ones keyed ``metric|rows``)."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    totals = dict.fromkeys((*ENGINE_METRICS, ROW_TOKENS), 0.0)
    for line in text.splitlines():
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        if name in totals:
            value = float(line.rsplit(" ", 1)[1])
            totals[name] += value
            tokens = re.search(r'tokens="(\d+)"', line)
            if name == "specbatch_row_step_tokens_total" and tokens:
                totals[ROW_TOKENS] += int(tokens.group(1)) * value
            k = re.search(r'k="(\d+)"', line)
            if name == "specbatch_lookahead_steps_total" and k:
                key = f"{STEPS_BY_K}|{k.group(1)}"
                totals[key] = totals.get(key, 0.0) + value
        elif name in BATCH_METRICS:
            rows = re.search(r'rows="([^"]+)"', line)
            key = f"{name}|{rows.group(1)}"
            totals[key] = totals.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def steps_by_k(delta: dict[str, float]) -> dict[str, int]:
    """A run's decode steps per K run (0: plain), where speculation switched itself off."""
    grown = {key.partition("|")[2]: int(n) for key, n in delta.items() if key.startswith(f"{STEPS_BY_K}|")}
    return {k: n for k, n in sorted(grown.items(), key=lambda item: int(item[0])) if n}


def by_batch(delta: dict[str, float]) -> dict[str, dict[str, float]]:
    """A run's committing steps per batch-size bucket (rows label -> steps, row_steps,
    tokens, prefill_tokens, seconds, and decode_steps, decode_seconds and
    decode_seconds_squared of those that prefilled nothing), from the per-batch
    counters' growth over the run."""
    buckets: dict[str, dict[str, float]] = {}
    for key, grown in delta.items():
        name, _, rows = key.partition("|")
        if name in BATCH_METRICS:
            buckets.setdefault(rows, dict.fromkeys(BATCH_METRICS.values(), 0.0))[BATCH_METRICS[name]] = grown
    return {rows: figures for rows, figures in buckets.items() if figures["steps"]}


@functools.cache
def server_log_dir() -> Path:
    """One directory for every server log of this run, kept for a look after it."""
    path = Path(tempfile.mkdtemp(prefix="bench_policies_logs_"))
    logger.info("server logs in %s", path)
    return path


def start_server(setup: Setup, name: str) -> TritonProcess:
    options = ServerOptions(
        root=setup.options.get("root", ROOT),
        host="127.0.0.1",
        ports=Ports.free(),
        exit_timeout_s=5,
        config_name=setup.options.get("config_name", "cpu"),
        env=setup.options.get("env", {}),
        only_model=setup.options.get("only_model"),
    )
    process = TritonProcess(options)
    process.start(server_log_dir() / f"{name}.log")
    process.wait_ready(300)
    return process


def triton_variant(max_batch_size: int, delay_ms: int, into: Path) -> Setup:
    """(c) at one dynamic_batching setting: a model repository of its own under ``into``
    holding qwen3_specdec with that setting in configs/cpu_triton_batching.pbtxt (Triton
    reads both only from the config file). Models resolve from that root, so it links
    .models; the Python package comes from the environment as for any start."""
    root = into / f"c-{max_batch_size}-{delay_ms}ms"
    model = root / "model_repository" / "qwen3_specdec"
    source = ROOT / "model_repository" / "qwen3_specdec"
    if not root.exists():
        (model / "configs").mkdir(parents=True)
        shutil.copytree(source / "1", model / "1")
        shutil.copy(source / "config.pbtxt", model / "config.pbtxt")
        text = (source / "configs" / "cpu_triton_batching.pbtxt").read_text()
        text = re.sub(r"max_batch_size: \d+", f"max_batch_size: {max_batch_size}", text)
        text = re.sub(
            r"max_queue_delay_microseconds: \d+", f"max_queue_delay_microseconds: {delay_ms * 1000}", text
        )
        (model / "configs" / "cpu_triton_batching.pbtxt").write_text(text)
        (root / ".models").symlink_to(ROOT / ".models")
    label = f"(c) Triton dynamic_batching (max batch {max_batch_size}, delay {delay_ms} ms)"
    return Setup(TRITON_BATCHING.name, label, {**TRITON_BATCHING.options, "root": root})


def server_env(setup: Setup, workload_env: dict, args: argparse.Namespace) -> dict:
    """The SPECBATCH_* overrides a set-up's server runs with on a workload: its own, the
    workload's, and for the scheduler the SLA it is held to."""
    env = dict(workload_env)
    if setup.name != TRITON_BATCHING.name:
        env |= {
            "SPECBATCH_SLA_TTFT_MS": f"{args.sla_ttft_s * 1000:g}",
            "SPECBATCH_SLA_FINISH_BASE_MS": f"{args.sla_base_s * 1000:g}",
            "SPECBATCH_SLA_FINISH_PER_TOKEN_MS": f"{args.sla_per_token_s * 1000:g}",
        }
    return {**setup.options.get("env", {}), **env}


def warm_up_arrivals() -> list[TimedRequest]:
    """What every server serves before its first measured phase: four short infobench
    prompts, so that no set-up's first phase pays for its first passes."""
    return build_workload(4.0, 2.0, 12345, 1.0)[:4] or [TimedRequest(0.0, "Warm up.", 8)]


class Session:
    """One tritonserver for one set-up: warmed, then runs phases one after another."""

    def __init__(self, setup: Setup, name: str, env: dict, args: argparse.Namespace) -> None:
        self.spec = (setup, name, env)
        self.setup = Setup(setup.name, setup.label, {**setup.options, "env": server_env(setup, env, args)})
        self.args = args
        self.ensemble = setup.name != TRITON_BATCHING.name
        self.process = start_server(self.setup, name)
        drive(self.process.grpc_url, self.setup, warm_up_arrivals(), timeout_s=120)

    def run(self, phase: str, rate: float, arrivals: list[TimedRequest], load: float | None = None) -> dict:
        args = self.args
        before = engine_metrics(self.process.metrics_url) if self.ensemble else None
        cpu_before = cpu_seconds(self.process)
        started = time.monotonic()
        records = drive(self.process.grpc_url, self.setup, arrivals, timeout_s=args.drain)
        cpu = cpu_seconds(self.process) - cpu_before
        row = summarise(self.setup, rate, arrivals, records, args)
        row |= {"phase": phase, "load": load, "wall_s": time.monotonic() - started}
        row["router_scheduler_cpu_s_per_request"] = cpu / len(arrivals) if self.ensemble else None
        if before is not None:
            time.sleep(1.5)  # the gauges are published at most every half second
            after = engine_metrics(self.process.metrics_url)
            delta = {k: after[k] - before.get(k, 0.0) for k in after}
            row["preemptions"] = int(delta["specbatch_preemptions"])
            # what the instances' steps cost in this run: the machine's speed under this load
            row["engine"] = {
                "step_seconds": delta["specbatch_step_seconds_total"],
                "cycle_seconds": delta["specbatch_cycle_seconds_total"],
                "steps": int(delta["specbatch_lookahead_steps_total"]),
                "row_steps": int(delta["specbatch_row_step_tokens_total"]),
                "row_tokens": int(delta[ROW_TOKENS]),
                "steps_by_k": steps_by_k(delta),
                "cut_for_kv_steps": int(delta["specbatch_lookahead_cut_for_kv_total"]),
                "by_batch": by_batch(delta),
            }
            prefilled = (
                delta["specbatch_prefix_hit_tokens_total"] + delta["specbatch_prefix_miss_tokens_total"]
            )
            row["prefilled_tokens"] = int(prefilled)
            row["reprefilled_tokens"] = max(0, int(prefilled) - row["input_tokens"])
        else:
            row["preemptions"] = row["reprefilled_tokens"] = None
        logger.info(
            "  %s %s at %.2f/s: %d/%d done, %d errors, %d lost, goodput %.2f/s, throughput %.2f/s%s%s",
            self.setup.name,
            phase,
            rate,
            row["completed"],
            row["offered"],
            row["errors"],
            row["lost"],
            row["goodput_rps"],
            row["throughput_rps"],
            f", {row['preemptions']} preemptions, {row['prefilled_tokens']} prefilled tokens"
            if row["preemptions"] is not None
            else "",
            f", first error: {row['first_error'][:120]}" if row["errors"] else "",
        )
        return row

    def capacity(self, workload: ServedWorkload, rate: float) -> dict:
        """The highest rate the set-up keeps up with: the overload probe (:meth:`overload`),
        then, where it saturated, its completions per second offered again and raised by
        SUSTAINED_STEP while the set-up :func:`keeps_up`, below the overload's rate. The
        first of those, at the completions themselves, raises nothing; the table reports
        whether the set-up kept up there, and where it did not, its capacity overstates
        what it sustains (as (c)'s did on `infobench` in the run on aa5e2d1). Under
        overload a set-up can complete fewer requests a second than it sustains: (c)'s
        static batches fill to their maximum and each is held by its longest row, and
        first-come batching preempts when the KV cache fills. On 452538d (c) completed
        4.88 req/s on `mixed` under a 10 req/s probe and then met every SLA at 5.86 req/s,
        "1.2x its capacity"; (b) on `memory` met every SLA at "1.0x" its own. A load
        named a multiple of capacity that does not load the set-up measures nothing."""
        overload = self.overload(workload, rate)
        capacity = {**overload, "capacity_rps": overload["throughput_rps"], "sustained": []}
        if not overload["saturated"]:
            return capacity
        candidate = overload["throughput_rps"]
        for _ in range(SUSTAINED_STEPS):
            if candidate >= overload["rate"]:
                break
            arrivals = workload.build(candidate, self.args.capacity_probe_s, self.args.seed + 1)
            row = self.run("sustained", candidate, arrivals)
            kept = keeps_up(row, arrivals, self.args)
            summary = {"rate": candidate, "kept_up": kept, "backlog_s": backlog_s(row, arrivals)}
            capacity["sustained"].append(summary | probe_summary(row))
            if not kept:
                break
            capacity["capacity_rps"] = candidate
            candidate *= SUSTAINED_STEP
        return capacity

    def overload(self, workload: ServedWorkload, rate: float) -> dict:
        """Completed requests per second under sustained overload: a probe at ``rate``,
        doubled while the set-up keeps up (:func:`saturated`), at most --probe-doublings
        times; the best probe's throughput."""
        args, best, previous = self.args, None, None
        for _ in range(args.probe_doublings + 1):
            arrivals = workload.build(rate, args.capacity_probe_s, args.seed + 1)
            row = self.run("capacity", rate, arrivals)
            row["saturated"] = saturated(row, arrivals, args, previous)
            if best is None or row["throughput_rps"] > best["throughput_rps"]:
                best = row
            if row["saturated"]:
                break
            previous = row
            rate *= 2
        return best | {"saturated": row["saturated"]}

    def restarted(self) -> Session:
        """This set-up on a fresh server, warmed as any: what a capacity probe leaves
        behind (a scheduler's b_SLA interval, pace floor and running statistics pushed by
        seconds of overload, the caches filled) is not carried into the cells that follow,
        so a set-up that was probed serves its loads from the same start as one that was
        not (the ablations)."""
        self.close()
        return Session(*self.spec, self.args)

    def close(self) -> None:
        self.process.stop()


def backlog_s(row: dict, arrivals: list[TimedRequest]) -> float:
    """Seconds a probe's work ran past its last arrival."""
    return row["span_s"] - arrivals[-1].at_s


def longest_sla_s(arrivals: list[TimedRequest], args: argparse.Namespace) -> float:
    return max(e2e_sla_s(arrival, args) for arrival in arrivals)


def saturated(
    row: dict, arrivals: list[TimedRequest], args: argparse.Namespace, previous: dict | None = None
) -> bool:
    """Whether a capacity probe ran past what the set-up can complete: its backlog took
    longer than half the probe (or the longest SLA) to drain, or it refused more than
    REFUSED_KEEPING_UP of the requests and completed less than PLATEAU_GAIN times what
    the probe before it (``previous``, at half the rate) did. A refusal or two is not
    saturation: a Poisson burst meets a queue sized for the SLA. Nor is a steady share of
    refusals while completions still rise with the offered rate: (a) refuses requests
    its admission predicts would start too late at any load. On `mixed` (6e573e3) it
    refused 4 of 98 at 10 req/s, 25 of 211 at 20 and 20 of 409 at 34 while completing
    9.3, 17.1 and 31.2 req/s; in the next run 5 of 98 at 10 req/s put its capacity at
    9.2 req/s, and its "2x capacity" overload was no overload. A first probe that refuses
    is judged by the next, at twice its rate."""
    if backlog_s(row, arrivals) > max(0.5 * args.capacity_probe_s, longest_sla_s(arrivals, args)):
        return True
    if row["errors"] <= REFUSED_KEEPING_UP * row["offered"]:
        return False
    return previous is not None and row["throughput_rps"] < PLATEAU_GAIN * previous["throughput_rps"]


def keeps_up(row: dict, arrivals: list[TimedRequest], args: argparse.Namespace) -> bool:
    """Whether the set-up kept up with a probe's rate: it refused at most
    REFUSED_KEEPING_UP of it, its work was done within the longest end-to-end SLA of the
    probe after the last arrival, and the requests that arrived last were not later
    against their SLA than the first ones (LATENESS_GROWTH, LATENESS_SLACK). The first
    third starts on an idle server, so the factor leaves room for the queue a steady load
    keeps; a rate past what the set-up completes adds the backlog of the probe's first
    two thirds to the last one's lateness, and a set-up already behind in the first
    third (a batch grown to its limit within a second) leaves a backlog at the end."""
    if row["errors"] > REFUSED_KEEPING_UP * row["offered"]:
        return False
    if backlog_s(row, arrivals) > longest_sla_s(arrivals, args):
        return False
    early, late = row["lateness_first_third"], row["lateness_last_third"]
    return late <= LATENESS_GROWTH * early + LATENESS_SLACK


def probe_summary(row: dict) -> dict:
    """What the capacity table shows of a probe."""
    keys = ("completed", "offered", "errors", "throughput_rps", "lateness_first_third", "lateness_last_third")
    return {key: row[key] for key in keys}


def sweep_triton(workload: ServedWorkload, args: argparse.Namespace, into: Path) -> tuple[list[dict], dict]:
    """Capacity of the shipped setting, then every setting of the grid at that rate; the
    best goodput wins (then throughput)."""
    grid = [SHIPPED] + [(b, d) for b in args.sweep_batch for d in args.sweep_delay_ms if (b, d) != SHIPPED]
    rows, probe = [], None
    for number, (batch, delay) in enumerate(grid, 1):
        setup = triton_variant(batch, delay, into)
        logger.info("%s sweep [%d/%d]: %s", workload.name, number, len(grid), setup.label)
        session = Session(setup, f"{workload.name}-sweep-{batch}-{delay}", workload.env, args)
        try:
            if probe is None:
                probe = session.capacity(workload, args.capacity_probe_rate)
                session = session.restarted()
            rate = probe["capacity_rps"]
            arrivals = workload.build(rate, args.sweep_duration, args.seed + 2)
            row = session.run("sweep", rate, arrivals, load=1.0)
        finally:
            session.close()
        rows.append(row | {"max_batch_size": batch, "delay_ms": delay})
    best = max(rows, key=lambda r: (r["goodput_rps"], r["throughput_rps"]))
    return rows, {"probe": probe, "max_batch_size": best["max_batch_size"], "delay_ms": best["delay_ms"]}


@dataclass(frozen=True)
class Turn:
    """One turn of a run: a set-up at a load (None: the prompt-heavy overload) in a round."""

    round: int
    setup: Setup
    load: float | None


def plan(setups: list[Setup], loads: list[float], rounds: int, overload: bool) -> list[Turn]:
    """The order the cells run in. One round: every load of one set-up, then the next (one
    server at a time). Several: round by round, every set-up at one load before the next
    load, in an order rotated each round, so that a slow spell of the shared machine falls
    on the set-ups alike instead of on whichever ran then; all servers stay up meanwhile.
    The overload runs (a) and, where (a) runs, the ablations of (a) chosen, at (a)'s rate."""
    names = {s.name for s in setups} if overload else set()
    heavy_names = {"least_slack", *(s.name for s in ABLATIONS)} if "least_slack" in names else set()
    heavy = [s for s in setups if s.name in heavy_names]
    turns = []
    if rounds == 1:
        for setup in setups:
            turns += [Turn(0, setup, load) for load in loads]
            if setup in heavy:
                turns.append(Turn(0, setup, None))
        return turns
    for index in range(rounds):
        shift = index % len(setups)
        order = setups[shift:] + setups[:shift]
        for load in loads:
            turns += [Turn(index, setup, load) for setup in order]
        turns += [Turn(index, setup, None) for setup in order if setup in heavy]
    return turns


def reference_first(setups: list[Setup], reference: str) -> list[Setup]:
    """The set-ups with the reference first: its capacity probe sets every load's rate,
    so it must run before any other set-up's first load."""
    return sorted(setups, key=lambda setup: setup.name != reference)


def arrival_seed(args: argparse.Namespace, round_index: int, offset: int = 0) -> int:
    """The seed of a round's arrivals: every set-up gets the same ones in a round."""
    return args.seed + offset + ROUND_SEED_STRIDE * round_index


def chosen_setups(workload: ServedWorkload, only: list[str] | None) -> list[Setup]:
    """The set-ups a workload runs: those ``only`` names (all of the workload's when
    None), an ablation named there even where the workload does not run ablations, and
    always its load reference and (c)."""
    keep = {workload.reference, TRITON_BATCHING.name, *(only or [s.name for s in SETUPS])}
    named = [s for s in ABLATIONS if s.name in (only or []) and s not in workload.setups]
    return [s for s in (*workload.setups, *named) if s.name in keep]


def run_workload(
    workload: ServedWorkload, args: argparse.Namespace, into: Path, best_c: dict | None
) -> tuple[dict, dict | None]:
    """Capacities, then every set-up at every load, --rounds times; (c) at its best setting.
    A set-up's server starts (warmed, then its capacity probed) at its first cell and
    stops after its last."""
    result: dict = {"name": workload.name, "title": workload.title, "capacities": {}, "rows": []}
    setups = chosen_setups(workload, args.only)
    if any(s.name == TRITON_BATCHING.name for s in setups):
        if best_c is None or args.sweep_all:
            result["sweep"], best_c = sweep_triton(workload, args, into)
        else:
            result["sweep_from"] = best_c.get("workload")
        best_c = {**best_c, "workload": best_c.get("workload", workload.name)}
        result["best_c"] = best_c
        tuned = triton_variant(best_c["max_batch_size"], best_c["delay_ms"], into)
        setups = [tuned if s.name == TRITON_BATCHING.name else s for s in setups]
    setups = reference_first(setups, workload.reference)
    if workload.overload:
        result["overloads"] = []
    turns = plan(setups, list(workload.loads or args.loads), args.rounds, workload.overload)
    last_turn = {turn.setup.name: index for index, turn in enumerate(turns)}
    sessions: dict[str, Session] = {}
    reference = None
    ablations = {s.name for s in ABLATIONS}
    try:
        for index, turn in enumerate(turns):
            setup = turn.setup
            session = sessions.get(setup.name)
            if session is None:
                logger.info("%s: %s", workload.name, setup.label)
                session = Session(setup, f"{workload.name}-{setup.name}", workload.env, args)
                sessions[setup.name] = session
                if setup.name not in ablations:
                    rate = args.capacity_probe_rate if reference is None else args.probe_factor * reference
                    probe = session.capacity(workload, max(rate, args.capacity_probe_rate))
                    result["capacities"][setup.name] = probe
                    if setup.name == workload.reference:
                        reference = probe["capacity_rps"]
                    session = sessions[setup.name] = session.restarted()
            if turn.load is None:
                rate = PROMPT_HEAVY_LOAD * result["capacities"]["least_slack"]["capacity_rps"]
                seed = arrival_seed(args, turn.round, OVERLOAD_SEED_OFFSET)
                arrivals = workload.build(rate, args.duration, seed)
                row = session.run("overload", rate, arrivals, PROMPT_HEAVY_LOAD)
                result["overloads"].append(row | {"round": turn.round, "seed": seed})
            else:
                seed = arrival_seed(args, turn.round)
                arrivals = workload.build(turn.load * reference, args.duration, seed)
                row = session.run("load", turn.load * reference, arrivals, turn.load)
                result["rows"].append(row | {"round": turn.round, "seed": seed})
            if last_turn[setup.name] == index:
                sessions.pop(setup.name).close()
    finally:
        for session in sessions.values():
            session.close()
    result["reference"] = workload.reference
    result["reference_capacity_rps"] = reference
    return result, best_c


def cell(rows: list[dict], setup: str, load: float, round_index: int) -> dict | None:
    return next(
        (r for r in rows if r["setup"] == setup and r["load"] == load and r["round"] == round_index), None
    )


def rounds_of(rows: list[dict]) -> list[int]:
    return sorted({r["round"] for r in rows})


def ratio(mine: dict | None, theirs: dict | None) -> float:
    if mine is None or theirs is None:
        return float("nan")
    if theirs["goodput_rps"] == 0:
        return float("inf") if mine["goodput_rps"] > 0 else float("nan")
    return mine["goodput_rps"] / theirs["goodput_rps"]


def ceiling(mine: dict | None, theirs: dict | None) -> float:
    """The highest goodput ratio ``mine`` could have read in the cell: every request
    meeting its SLA, against ``theirs`` as measured. Below a target's requirement, no
    scheduler could have met the target on that cell's arrivals (the peer already met
    nearly every SLA); NaN for rows written before the ceiling was recorded."""
    if mine is None or theirs is None or "goodput_ceiling_rps" not in mine or theirs["goodput_rps"] == 0:
        return float("nan")
    return mine["goodput_ceiling_rps"] / theirs["goodput_rps"]


def targets(results: list[dict]) -> list[dict]:
    """Every target of the issue as a measured ratio against what it requires."""
    out = []

    def goodput(workload: str, what: str, mine: str, theirs: str, load: float, need: float) -> None:
        measured = next(w for w in results if w["name"] == workload)
        rows = measured["rows"]
        pairs = [(cell(rows, mine, load, r), cell(rows, theirs, load, r)) for r in rounds_of(rows)]
        values = [v for v in (ratio(m, t) for m, t in pairs) if v == v]  # measured
        ceilings = [v for v in (ceiling(m, t) for m, t in pairs) if v == v]
        if values:
            out.append(
                {
                    "workload": workload,
                    "target": what,
                    "load": load,
                    "value": statistics.median(values),
                    "by_round": values,
                    "need": need,
                    "reference": measured.get("reference"),
                    "ceiling": statistics.median(ceilings) if ceilings else float("nan"),
                }
            )

    for w in results:
        name = w["name"]
        if name == "memory":
            for load in sorted({r["load"] for r in w["rows"]}):
                goodput(name, "(a) goodput / (b)", "least_slack", "fcfs", load, 1.2)
                pairs = [
                    (cell(w["rows"], "least_slack", load, r), cell(w["rows"], "fcfs", load, r))
                    for r in rounds_of(w["rows"])
                ]
                a = sum(mine["preemptions"] for mine, theirs in pairs if mine and theirs)
                b = sum(theirs["preemptions"] for mine, theirs in pairs if mine and theirs)
                out.append(
                    {
                        "workload": name,
                        "target": "(a) preemptions / (b)",
                        "load": load,
                        "value": a / b if b else float("nan"),
                        "need": 0.2,
                        "at_most": True,
                    }
                )
            continue
        if w.get("reference", TRITON_BATCHING.name) == TRITON_BATCHING.name:  # set at (c)'s capacity
            goodput(name, "(a) goodput / best (c)", "least_slack", "triton_batching", 1.0, 1.3)
            goodput(name, "(a) goodput / best (c)", "least_slack", "triton_batching", 1.2, 1.5)
        for load in sorted({r["load"] for r in w["rows"]}):
            goodput(name, "(a) goodput / (b)", "least_slack", "fcfs", load, 1.2 if load == 1.2 else 1.0)
            goodput(name, "(a) goodput / (d)", "least_slack", "shortest_first", load, 1.0)
        overload_targets = (
            (f"(a) at {PROMPT_HEAVY_LOAD:g}× its capacity: admitted e2e p99 / SLA", "e2e_over_sla_p99", 2.0),
            ("(a) refused at once: refusal p99 s", "refusal_p99_s", REFUSED_AT_ONCE_S),
        )
        for what, key, need in overload_targets if w.get("overloads") else ():
            mine = [o for o in w["overloads"] if o["setup"] == "least_slack"]
            values = [o[key] for o in mine if o[key] == o[key]]  # NaN: none refused
            out.append(
                {
                    "workload": name,
                    "target": what,
                    "load": None,
                    "value": statistics.median(values) if values else float("nan"),
                    "by_round": values,
                    "need": need,
                    "at_most": True,
                }
            )
    for t in out:
        at_most = t.get("at_most", False)
        t["met"] = t["value"] == t["value"] and (
            t["value"] <= t["need"] if at_most else t["value"] >= t["need"]
        )
    return out


def number(value: float | None, digits: int = 2) -> str:
    if value is None or value != value:
        return "—"
    return f"{value:.{digits}f}"


def sweep_table(rows: list[dict]) -> str:
    best = max(rows, key=lambda r: (r["goodput_rps"], r["throughput_rps"]))
    lines = [
        "| max batch | queue delay | goodput req/s | throughput req/s | SLA met | TTFT p95 s | e2e p99 s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["max_batch_size"], r["delay_ms"])):
        mark = " **best**" if r is best else ""
        lines.append(
            f"| {r['max_batch_size']} | {r['delay_ms']} ms{mark} | {r['goodput_rps']:.2f} "
            f"| {r['throughput_rps']:.2f} | {r['sla_met']:.0%} | {number(r['ttft_p95_s'])} "
            f"| {number(r['e2e_p99_s'])} |"
        )
    return "\n".join(lines)


def capacity_table(result: dict) -> str:
    lines = [
        "| set-up | capacity req/s | overload probe: offered req/s | completed | refused | completed req/s "
        "| saturated | sustained probes: req/s offered (backlog s, late/early lateness, kept up) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for probe in result["capacities"].values():
        sustained = ", ".join(
            f"{p['rate']:.2f} ({p['backlog_s']:.1f}, "
            f"{number(p['lateness_last_third'])}/{number(p['lateness_first_third'])}, "
            f"{'yes' if p['kept_up'] else 'no'})"
            for p in probe["sustained"]
        )
        lines.append(
            f"| {probe['label']} | {probe['capacity_rps']:.2f} | {probe['rate']:.2f} "
            f"| {probe['completed']}/{probe['offered']} | {probe['errors']} | {probe['throughput_rps']:.2f} "
            f"| {'yes' if probe['saturated'] else 'no (a lower bound)'} | {sustained or '—'} |"
        )
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    lines = [
        "| load | set-up | completed | refused | throughput req/s | goodput req/s | vs (c) | vs (b) "
        "| SLA met | TTFT p95 s | e2e p99 s | preemptions | re-prefilled tokens "
        "| router+scheduler CPU ms/req |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    several = len(rounds_of(rows)) > 1
    for r in sorted(rows, key=lambda r: (r["round"], r["load"])):
        c = cell(rows, "triton_batching", r["load"], r["round"])
        b = cell(rows, "fcfs", r["load"], r["round"])
        cpu = r["router_scheduler_cpu_s_per_request"]
        where = f", round {r['round'] + 1}" if several else ""
        lines.append(
            f"| {r['load']:.1f}× ({r['rate']:.2f}/s{where}) | {r['label']} | {r['completed']}/{r['offered']} "
            f"| {r['errors']} | {r['throughput_rps']:.2f} | {r['goodput_rps']:.2f} | {number(ratio(r, c))} "
            f"| {number(ratio(r, b))} | {r['sla_met']:.0%} | {number(r['ttft_p95_s'])} "
            f"| {number(r['e2e_p99_s'])} "
            f"| {'—' if r['preemptions'] is None else r['preemptions']} "
            f"| {'—' if r['reprefilled_tokens'] is None else r['reprefilled_tokens']} "
            f"| {'—' if cpu is None else f'{cpu * 1000:.1f}'} |"
        )
    return "\n".join(lines)


def overload_table(rows: list[dict]) -> str:
    lines = [
        "| set-up | round | offered req/s | admitted and completed | refused | lost | admitted e2e p99 / SLA "
        "| e2e p99 s | refusal p99 s | goodput req/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {setup_label(row['setup'])} | {row['round'] + 1} | {row['rate']:.2f} "
            f"| {row['completed']}/{row['offered']} "
            f"| {row['errors']} | {row['lost']} | {number(row['e2e_over_sla_p99'])} "
            f"| {number(row['e2e_p99_s'])} | {number(row['refusal_p99_s'], 3)} | {row['goodput_rps']:.2f} |"
        )
    return "\n".join(lines)


def setup_label(setup: str) -> str:
    return next(s.label for s in SETUPS if s.name == setup)


def short_label(setup: str) -> str:
    """A set-up's letter: "(a)" for least_slack."""
    return next(s.label.split(" ")[0] for s in SETUPS if s.name == setup)


def targets_table(rows: list[dict]) -> str:
    lines = [
        "| workload | target | load | measured (median) | by round | required | met | most the cell allows |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in rows:
        need = f"≤ {t['need']:g}" if t.get("at_most") else f"≥ {t['need']:g}"
        load = "—" if t["load"] is None else f"{t['load']:.1f}×"
        if t["load"] is not None and t.get("reference"):
            load += f" {short_label(t['reference'])}"
        if t["met"] or t["value"] != t["value"]:
            verdict = "yes" if t["met"] else "not measured"
        elif t.get("at_most"):
            verdict = f"**no** ({t['value'] / t['need']:.2f}× the bound)"
        else:
            verdict = f"**no** (short by {1 - t['value'] / t['need']:.1%})"
        by_round = ", ".join(number(v) for v in t.get("by_round", [t["value"]]))
        lines.append(
            f"| {t['workload']} | {t['target']} | {load} | {number(t['value'])} | {by_round} | {need} "
            f"| {verdict} | {number(t.get('ceiling'))} |"
        )
    return "\n".join(lines)


def report(results: list[dict], checks: list[dict]) -> str:
    parts = []
    for w in results:
        parts.append(f"### {w['name']}: {w['title']}\n")
        if "sweep" in w:
            parts.append(
                f"Sweep of (c) at the shipped setting's capacity ({w['sweep'][0]['rate']:.2f} req/s):\n"
            )
            parts.append(sweep_table(w["sweep"]) + "\n")
        elif "best_c" in w:
            best = w["best_c"]
            parts.append(
                f"(c) at the best setting of the {best['workload']} sweep "
                f"(max batch {best['max_batch_size']}, {best['delay_ms']} ms): not swept again.\n"
            )
        parts.append("Capacities (the highest rate kept up with; completions under overload beside):\n")
        parts.append(capacity_table(w) + "\n")
        parts.append(
            f"Loads are multiples of {short_label(w['reference'])}'s capacity "
            f"({w['reference_capacity_rps']:.2f} req/s).\n"
        )
        parts.append(table(w["rows"]) + "\n")
        if w.get("overloads"):
            parts.append(f"(a) at {PROMPT_HEAVY_LOAD:g}× its own capacity:\n")
            parts.append(overload_table(w["overloads"]) + "\n")
    parts.append("### Targets\n")
    parts.append(targets_table(checks))
    parts.append(
        "\nMost the cell allows: the ratio (a) would read had every request it was offered met its"
        " SLA, over the peer's measured goodput (median of the rounds). Under the requirement, the"
        " peer met nearly every SLA itself and no scheduler could have met the target on those arrivals."
    )
    return "\n".join(parts)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    ablations = {s.name for s in ABLATIONS}
    for name in dict.fromkeys(r["setup"] for r in rows):
        mine = [r for r in rows if r["setup"] == name]
        style = "--" if name in ablations else "-"
        loads = sorted({r["load"] for r in mine})
        for axis, key in ((left, "goodput_rps"), (right, "ttft_p95_s")):
            values = [[r[key] for r in mine if r["load"] == load] for load in loads]
            middle = [statistics.median(v) for v in values]
            below = [m - min(v) for m, v in zip(middle, values, strict=True)]
            above = [max(v) - m for m, v in zip(middle, values, strict=True)]
            axis.errorbar(
                loads, middle, yerr=[below, above], fmt=style, marker="o", capsize=3, label=mine[0]["label"]
            )
    for axis in (left, right):
        axis.set_xlabel(f"offered load (× capacity of {short_label(result['reference'])})")
    left.set_ylabel("goodput (requests/s within SLA)")
    right.set_ylabel("TTFT p95 (s)")
    right.set_yscale("log")
    left.legend(fontsize=7)
    fig.suptitle(
        f"{result['name']}: {result['title']} (capacity {result['reference_capacity_rps']:.2f} req/s)"
    )
    save_figure(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="CI size: short runs, (c) swept on infobench only"
    )
    parser.add_argument("--duration", type=float, help="seconds of arrivals per load")
    parser.add_argument("--sweep-duration", type=float, help="seconds of arrivals per setting of (c)'s sweep")
    parser.add_argument("--capacity-probe-s", type=float, help="seconds of arrivals of a capacity probe")
    parser.add_argument("--drain", type=float, help="seconds to wait for stragglers after the last arrival")
    parser.add_argument(
        "--capacity-probe-rate", type=float, default=10.0, help="overload rate of the first capacity probe"
    )
    parser.add_argument(
        "--probe-factor",
        type=float,
        default=2.5,
        help="later probes run at this multiple of the reference capacity",
    )
    parser.add_argument(
        "--probe-doublings", type=int, default=2, help="times a probe the set-up keeps up with is doubled"
    )
    parser.add_argument("--loads", type=float, nargs="+", default=list(LOADS))
    parser.add_argument("--sweep-batch", type=int, nargs="+", default=list(SWEEP_BATCH))
    parser.add_argument("--sweep-delay-ms", type=int, nargs="+", default=list(SWEEP_DELAY_MS))
    parser.add_argument(
        "--only", action="append", choices=[s.name for s in SETUPS], help="these set-ups (and the references)"
    )
    parser.add_argument(
        "--memory-loads",
        type=float,
        nargs="+",
        default=[1.0, 1.5, 2.0],
        help="memory regime, × (b)'s capacity",
    )
    parser.add_argument("--workloads", nargs="+", choices=["infobench", "mixed", "heavy", "memory"])
    parser.add_argument(
        "--load-reference",
        choices=[TRITON_BATCHING.name, "least_slack"],
        default=TRITON_BATCHING.name,
        help="whose capacity the loads of infobench, mixed and heavy are multiples of: (c)'s, as "
        "the targets against (c) are set, or (a)'s; memory's are (b)'s",
    )
    parser.add_argument(
        "--sweep-all", action="store_true", help="sweep (c) on every workload (default unless --quick)"
    )
    parser.add_argument(
        "--memory-budget-gb", type=float, default=0.01, help="KV budget per instance, memory regime"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every cell this many times, interleaved (targets: the median of per-round ratios)",
    )
    parser.add_argument("--short-share", type=float, default=0.6, help="share of 8–32-token requests")
    parser.add_argument("--sla-ttft-s", type=float, default=2.0)
    parser.add_argument("--sla-base-s", type=float, default=0.5)
    parser.add_argument("--sla-per-token-s", type=float, default=0.01)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_policies.json")
    parser.add_argument("--plot-dir", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--markdown", type=Path, help="also write the tables here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.sweep_all = args.sweep_all or not args.quick
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    ensure_tiny_models(ROOT)
    started = time.monotonic()
    chosen = [w for w in workloads(args) if not args.workloads or w.name in args.workloads]
    results, best_c = [], None
    with tempfile.TemporaryDirectory(prefix="bench_policies_c_") as into:
        for workload in chosen:
            logger.info("workload %s: %s", workload.name, workload.title)
            result, best_c = run_workload(workload, args, Path(into), best_c)
            results.append(result)
            plot(result, args.plot_dir / f"bench_policies_{workload.name}.png")
    checks = targets(results)
    text = report(results, checks)
    print(text)
    elapsed = time.monotonic() - started
    print(f"\n{elapsed / 60:.1f} minutes")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "config": {k: str(v) for k, v in vars(args).items()},
                "elapsed_s": elapsed,
                "workloads": results,
                "targets": checks,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
