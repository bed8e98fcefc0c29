"""Soak test: minutes of the mixed workload at a share of capacity, checking that nothing leaks.

Leaks show only over time: a request answered twice or never, memory that creeps, a queue
that never empties. A real tritonserver (`cpu` config, tiny pair) takes open-loop Poisson
arrivals of loadtest/profiles/mixed.yaml's graph/mmlu/infobench mix at --load x capacity.
Each request has a gRPC stream of its own, so every response is attributed to its request
(tritonclient drops the request id of error responses on a shared stream). Mixed in:

  stream            `stream` = True: text deltas, then the final response
  deadline          a short request timeout that some requests miss ("deadline exceeded")
  cancel_ensemble   a `specbatch` stream cancelled mid-flight; Triton 2.51 does not pass
                    that on to the ensemble's steps, so the server runs it to its end
  cancel_scheduler  router, then a `scheduler` stream (the OpenAI front's path), cancelled
                    mid-flight: the scheduler drops its rows within a decode step

Every ~5 s: the RSS of tritonserver and each Python backend stub, the scheduler's queue
depth. Exits non-zero when a request was lost or answered twice. Usage:
    .venv/bin/python scripts/soak.py --out results/soak
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import re
import sys
import time
import urllib.request
from argparse import RawDescriptionHelpFormatter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import tritonclient.grpc.aio as grpcclient  # noqa: E402
from bench_policies import cpu_seconds  # noqa: E402

from specbatch.figures import save_figure  # noqa: E402
from specbatch.loadtest.arrivals import ArrivalSchedule  # noqa: E402
from specbatch.loadtest.capacity import Probe, describe, probe_until_overloaded  # noqa: E402
from specbatch.loadtest.profiles import Arrival, load_profile  # noqa: E402
from specbatch.loadtest.prompts import PromptPool, build_prompt_pool  # noqa: E402
from specbatch.openai.errors import OpenAIError, from_pipeline  # noqa: E402
from specbatch.openai.requests import Call  # noqa: E402
from specbatch.openai.upstream import TritonUpstream, scheduler_arrays, triton_datatype  # noqa: E402
from specbatch.server.launcher import ensure_tiny_models  # noqa: E402
from specbatch.server.ports import Ports  # noqa: E402
from specbatch.server.process import ServerOptions, TritonProcess  # noqa: E402

logger = logging.getLogger("soak")
PROFILE = ROOT / "loadtest" / "profiles" / "mixed.yaml"
KINDS = ("plain", "stream", "deadline", "cancel_ensemble", "cancel_scheduler")
OUTCOMES = ("ok", "overloaded", "deadline exceeded", "cancelled", "other", "client-cancelled", "lost")
ERROR_CLASSES = {"overloaded": "overloaded", "deadline_exceeded": "deadline exceeded"}  # by OpenAIError.code
Clock = Callable[[], float]
LINGER_S = 2.0  # how long a stream is watched after its final response for a second answer
SERVER_PROMPTS = {"answered": "", "cancelled": 'finish_reason="cancelled"'}  # specbatch_prompts_total
SETTLE_S, IDLE_S = 5.0, 10.0  # after the last answer: wait, then measure the engines' CPU while idle
MIB = 1024.0


@dataclass
class Record:
    """One request: what was sent, and every answer it got (more than one is a duplicate)."""

    id: int
    kind: str
    task: str
    sent_s: float
    outcome: str = "lost"
    end_s: float | None = None
    message: str = ""
    extra_responses: int = 0

    def settle(self, at_s: float, outcome: str, message: str = "") -> None:
        if self.end_s is not None:
            self.extra_responses += 1
            return
        self.outcome, self.end_s, self.message = outcome, at_s, message


def error_class(message: str) -> str:
    """The client-facing class of an error, by the same wording rules the OpenAI front uses."""
    fallback = "cancelled" if "cancel" in message.lower() else "other"
    return ERROR_CLASSES.get(from_pipeline(message).code, fallback)


def ensemble_inputs(call: Call) -> list:
    """The ensemble's inputs are the scheduler's minus what the router adds."""
    return [
        grpcclient.InferInput(n, list(a.shape), triton_datatype(a.dtype)).set_data_from_numpy(a)
        for n, a in scheduler_arrays(call, {}).items()
    ]


async def read_answers(responses, record: Record, clock: Clock, timeout_s: float) -> None:
    """Read the request's stream until it closes; after the final answer, for LINGER_S more
    so that a second answer would be seen."""
    give_up = record.sent_s + timeout_s
    while True:
        wait = LINGER_S if record.end_s is not None else give_up - clock()
        try:
            result, error = await asyncio.wait_for(responses.__anext__(), max(wait, 0.0))
        except (StopAsyncIteration, asyncio.TimeoutError):
            return
        except grpc.aio.AioRpcError as exc:
            record.settle(clock(), error_class(exc.details() or ""), exc.details() or str(exc.code()))
            return
        if record.outcome == "client-cancelled":  # wait_for may swallow the cancel of a read that ended
            return
        if error is not None:
            record.settle(clock(), error_class(error.message()), error.message())
            continue
        response = result.get_response()
        if response.parameters["triton_final_response"].bool_param:
            errors = result.as_numpy("error")
            message = errors.reshape(-1)[0].decode() if errors is not None and errors.size else ""
            record.settle(clock(), error_class(message) if message else "ok", message)
        elif record.end_s is not None:
            record.extra_responses += 1


async def ensemble_request(
    client: grpcclient.InferenceServerClient,
    call: Call,
    record: Record,
    clock: Clock,
    timeout_us: int | None,
    timeout_s: float,
) -> None:
    """One request on a stream of its own, so that every response on it is this request's."""
    request = {"model_name": "specbatch", "inputs": ensemble_inputs(call), "timeout": timeout_us}
    request["request_id"] = str(record.id)

    async def one():
        yield request

    responses = client.stream_infer(one())
    try:
        await read_answers(responses, record, clock, timeout_s)
    finally:
        responses.cancel()


async def scheduler_request(upstream: TritonUpstream, call: Call, record: Record, clock: Clock) -> None:
    """Router then scheduler, as the OpenAI front calls them: the path where a cancel frees rows."""
    try:
        async for item in upstream.run(call):
            if isinstance(item, list):
                record.settle(clock(), error_class(item[0].error) if item[0].error else "ok", item[0].error)
    except OpenAIError as exc:
        record.settle(clock(), error_class(exc.message), exc.message)


async def cancelled_after(work, record: Record, clock: Clock, after_s: float) -> None:
    """Run `work`; if it has not answered after `after_s`, cancel it (closing its stream)."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=after_s)
    if not done and record.end_s is None:
        record.settle(clock(), "client-cancelled")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def metric_sum(text: str, name: str, label: str = "") -> float:
    """Sum of a Prometheus metric's samples whose labels contain `label`."""
    pattern = rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)$"
    return sum(float(v) for labels, v in re.findall(pattern, text, re.MULTILINE) if label in labels)


def scrape(process: TritonProcess) -> str:
    """The server's Prometheus metrics: the scheduler's own gauges are only visible there."""
    with urllib.request.urlopen(process.metrics_url, timeout=10) as reply:
        return reply.read().decode()


def sample_server(process: TritonProcess, at_s: float) -> dict:
    """RSS (KiB) of tritonserver and every stub, and the scheduler's queue and running rows."""
    rss = {}
    for name, pid in {"tritonserver": process.process.pid, **process.stub_pids()}.items():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if found := re.search(r"^VmRSS:\s+(\d+)", status, re.MULTILINE):  # a zombie has none
            rss[name] = int(found.group(1))
    metrics = scrape(process)
    queue, rows = (metric_sum(metrics, f"specbatch_{name}") for name in ("queue_depth", "running_rows"))
    return {"t_s": at_s, "rss_kib": rss, "queue_depth": queue, "running_rows": rows}


def draw_kind(rng: random.Random, args: argparse.Namespace) -> str:
    """The next request's kind, by the --*-share options (the rest are plain requests)."""
    half_cancel = args.cancel_share / 2
    shares = zip(KINDS[1:], (args.stream_share, args.deadline_share, half_cancel, half_cancel), strict=True)
    roll = rng.random()
    for kind, share in shares:
        if roll < share:
            return kind
        roll -= share
    return "plain"


async def drive(process: TritonProcess, pool: PromptPool, rate: float, args: argparse.Namespace) -> dict:
    """Open-loop arrivals for --minutes while sampling; then wait for every answer."""
    rng = random.Random(args.seed)
    # cancelled requests get long infobench prompts, so that the cancel lands mid-generation
    long_pool = PromptPool(pool.prompts_by_task, {"infobench": 1.0}, {"infobench": (64, 128)})
    schedule = ArrivalSchedule(Arrival("poisson", rate=rate), users=1, rng=rng)
    client = grpcclient.InferenceServerClient(process.grpc_url)
    upstream = TritonUpstream(process.grpc_url)
    duration_s, warmup_s = args.minutes * 60, args.warmup_minutes * 60
    before = await asyncio.to_thread(scrape, process)  # the counters are the server's, since its start
    start = time.monotonic()

    def clock() -> float:
        return time.monotonic() - start

    records: list[Record] = []
    samples: list[dict] = []
    tasks: list[asyncio.Task] = []

    async def sampler() -> None:
        next_log = 30.0
        while True:
            try:
                samples.append(await asyncio.to_thread(sample_server, process, clock()))
            except OSError as exc:  # a refused or slow scrape: the next one may work
                logger.warning("sampling the server failed: %s", exc)
            if samples and clock() >= next_log:
                next_log += 30.0
                answered = sum(r.end_s is not None for r in records)
                errors = sum(r.outcome not in ("ok", "client-cancelled", "lost") for r in records)
                queue, rss = samples[-1]["queue_depth"], samples[-1]["rss_kib"].get("tritonserver", 0) / MIB
                logger.info(
                    f"t={clock():4.0f}s {'warm-up' if clock() < warmup_s else 'soak'}: sent {len(records)}, "
                    f"answered {answered}, errors {errors}, queue {queue:.0f}, tritonserver RSS {rss:.0f} MiB"
                )
            await asyncio.sleep(args.sample_s)

    sampling = asyncio.create_task(sampler())
    logger.info("load: %.2f req/s for %.1f min (warm-up %.1f min)", rate, args.minutes, args.warmup_minutes)
    while (delay := schedule.wait(clock())) + clock() < duration_s:
        await asyncio.sleep(delay)
        kind = draw_kind(rng, args)
        choice = (long_pool if kind.startswith("cancel") else pool).draw(rng)
        streamed = kind not in ("plain", "deadline")
        call = Call("completion", "specbatch", (choice.text,), choice.max_tokens, stream=streamed)
        record = Record(len(records), kind, choice.task, clock())
        records.append(record)
        if kind == "cancel_scheduler":
            work = scheduler_request(upstream, call, record, clock)
        else:
            timeout_us = int(rng.uniform(*args.deadline_s) * 1e6) if kind == "deadline" else None
            work = ensemble_request(client, call, record, clock, timeout_us, args.answer_timeout)
        if kind.startswith("cancel"):
            work = cancelled_after(work, record, clock, rng.uniform(*args.cancel_after_s))
        tasks.append(asyncio.create_task(work))

    logger.info("arrivals done at %.0f s: %d requests; waiting for their answers", clock(), len(records))
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=args.answer_timeout + LINGER_S + 10)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    await asyncio.sleep(SETTLE_S)  # ensemble requests a client cancelled run to their end
    engines_cpu = cpu_seconds(process, ("qwen3_specdec",))
    await asyncio.sleep(IDLE_S)
    idle_cpu_pct = (cpu_seconds(process, ("qwen3_specdec",)) - engines_cpu) / IDLE_S * 100
    sampling.cancel()
    end = await asyncio.to_thread(sample_server, process, clock()) | {"engines_cpu_pct": idle_cpu_pct}
    metrics = await asyncio.to_thread(scrape, process)
    (args.out / "metrics-after-drain.prom").write_text(metrics)
    await asyncio.gather(client.close(), upstream.close())
    logger.info(f"idle at {clock():.0f} s: queue {end['queue_depth']:.0f}, engines CPU {idle_cpu_pct:.0f} %")
    prompts = {
        k: metric_sum(metrics, "specbatch_prompts_total", v)
        - metric_sum(before, "specbatch_prompts_total", v)
        for k, v in SERVER_PROMPTS.items()
    }
    run = {"records": records, "samples": samples, "end": end, "server_prompts": prompts}
    return run | {"duration_s": duration_s, "warmup_s": warmup_s}


def summarise(run: dict, log_path: Path) -> dict:
    """Counts per kind and outcome, RSS per process after warm-up, queue depth, server log errors."""
    records, warmup_s, duration_s = run["records"], run["warmup_s"], run["duration_s"]
    counts = {kind: dict.fromkeys((*OUTCOMES, "sent", "duplicates"), 0) for kind in (*KINDS, "total")}
    for r in records:
        for key in (r.kind, "total"):
            counts[key]["sent"] += 1
            counts[key][r.outcome] += 1
            counts[key]["duplicates"] += r.extra_responses > 0
    window = [s for s in run["samples"] if s["t_s"] <= duration_s]
    warm = [s for s in window if s["t_s"] <= warmup_s] or window[:1]
    after = [s for s in window if s["t_s"] > warmup_s] or window[-1:]
    rss = {}
    for name, base in warm[-1]["rss_kib"].items():
        if not (values := [s["rss_kib"][name] for s in after if name in s["rss_kib"]]):
            continue
        deviation = max(abs(v - base) / base * 100 for v in values)
        mib = {"warmup_mib": base / MIB, "end_mib": values[-1] / MIB, "max_mib": max(values) / MIB}
        growth = (values[-1] - base) / base * 100
        rss[name] = mib | {"growth_pct": growth, "max_deviation_pct": deviation, "flat": deviation <= 5.0}
    depths = [s["queue_depth"] for s in after]
    e2e = [r.end_s - r.sent_s for r in records if r.outcome == "ok"]
    log = log_path.read_text(errors="replace").splitlines() if log_path.exists() else []
    errors = [line for line in log if re.match(r"^E\d{4} |.*(Traceback|ERROR|Error:)", line)]
    return {
        "counts": counts,
        "rss": rss,
        "queue_depth": {"max": max(depths), "mean": float(np.mean(depths))},
        "idle": {k: run["end"][k] for k in ("queue_depth", "running_rows", "engines_cpu_pct")},
        "server_prompts": run["server_prompts"],
        "e2e_ok_p50_p99_s": [float(np.percentile(e2e, q)) for q in (50, 99)] if e2e else None,
        "log_error_lines": len(errors),
        "log_errors_first": errors[:20],
    }


def markdown(summary: dict, header: str) -> str:
    """The tables docs/BENCHMARKS.md takes as they are."""
    columns = ("sent", *OUTCOMES, "duplicates")
    lines = [header, "", "| kind | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for kind, row in summary["counts"].items():
        lines.append(f"| {kind} | " + " | ".join(str(row[c]) for c in columns) + " |")
    lines += [
        "",
        "| process | RSS after warm-up MiB | RSS at end MiB | max MiB | growth % | max deviation % "
        "| flat (±5 %) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, p in summary["rss"].items():
        lines.append(
            f"| {name} | {p['warmup_mib']:.0f} | {p['end_mib']:.0f} | {p['max_mib']:.0f} "
            f"| {p['growth_pct']:+.1f} | {p['max_deviation_pct']:.1f} | {'yes' if p['flat'] else '**no**'} |"
        )
    queue, idle = summary["queue_depth"], summary["idle"]
    server, e2e = summary["server_prompts"], summary["e2e_ok_p50_p99_s"]
    lines += [
        "",
        f"Queue depth after warm-up: max {queue['max']:.0f}, mean {queue['mean']:.2f}. Idle after the drain: "
        f"queue {idle['queue_depth']:.0f}, running-rows gauge {idle['running_rows']:.0f}, "
        f"qwen3_specdec CPU {idle['engines_cpu_pct']:.0f} % of a core. "
        f"The scheduler answered {server['answered']:.0f} prompts for {summary['counts']['total']['sent']} "
        f"requests, {server['cancelled']:.0f} as cancelled (client cancels, missed deadlines). "
        + (f"e2e of ok answers: p50 {e2e[0]:.2f} s, p99 {e2e[1]:.2f} s. " if e2e else "")
        + f"Server log: {summary['log_error_lines']} error lines (see soak.json).",
    ]
    return "\n".join(lines)


def plot(run: dict, path: Path, title: str) -> None:
    """Memory, queue and completions on one time axis, so a creep lines up with what caused it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = run["samples"]
    fig, (mem, queue, done) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    times = [s["t_s"] for s in samples]
    for name in sorted({n for s in samples for n in s["rss_kib"]}):
        mem.plot(times, [s["rss_kib"].get(name, np.nan) / MIB for s in samples], label=name)
    mem.set(ylabel="RSS (MiB, log scale)", yscale="log")
    mem.legend(fontsize=7, ncol=3)
    queue.plot(times, [s["queue_depth"] for s in samples], label="queue depth")
    queue.plot(times, [s["running_rows"] for s in samples], label="running rows")
    queue.set_ylabel("prompts")
    queue.legend(fontsize=8)
    bins = np.arange(0.0, max([*times, run["duration_s"]]) + 5.0, 5.0)
    ends = [r.end_s for r in run["records"] if r.end_s is not None and r.outcome != "client-cancelled"]
    done.hist(ends, bins=bins, weights=np.full(len(ends), 1 / 5.0))
    done.set_ylabel("completions/s")
    done.set_xlabel("seconds since the load started")
    for axis in (mem, queue, done):
        axis.axvspan(0, run["warmup_s"], color="grey", alpha=0.15)
    mem.set_title(title)
    save_figure(fig, path, dpi=110)


def measure_capacity(process: TritonProcess, pool: PromptPool, args: argparse.Namespace) -> tuple[float, str]:
    """Answers per second the pipeline completes under sustained overload of the same mix
    (plain requests only; the queue bound refuses the excess): what 100 % means here. The
    probe doubles its rate while the pipeline keeps up (`probe_until_overloaded`)."""
    settings = argparse.Namespace(
        **{
            **vars(args),
            "minutes": args.probe_minutes,
            "warmup_minutes": 0.0,
            "stream_share": 0.0,
            "deadline_share": 0.0,
            "cancel_share": 0.0,
        }
    )

    def probe(rate: float) -> Probe:
        logger.info("measuring capacity: %.1f req/s offered for %.1f min", rate, args.probe_minutes)
        records = asyncio.run(drive(process, pool, rate, settings))["records"]
        served = [r for r in records if r.outcome == "ok"]
        refused = sum(r.outcome == "overloaded" for r in records)
        answered_rps = len(served) / max(r.end_s for r in served)
        logger.info(
            "probe: %d answered, %d refused as overloaded: %.2f req/s", len(served), refused, answered_rps
        )
        return Probe(rate, len(records), len(served), refused, answered_rps)

    best, probes = probe_until_overloaded(probe, args.probe_rate)
    source = f"measured on plain requests of the same mix: {describe(probes)}"
    return best.answered_rps, source


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=RawDescriptionHelpFormatter)
    parser.add_argument("--capacity", type=float, help="req/s; measured first on the same server if left out")
    parser.add_argument(
        "--probe-rate",
        type=float,
        default=30.0,
        help="req/s first offered to measure capacity (doubled while kept up)",
    )
    parser.add_argument("--probe-minutes", type=float, default=1.0)
    parser.add_argument("--load", type=float, default=0.8, help="offered load as a share of capacity")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warmup-minutes", type=float, default=2.0)
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between RSS/queue samples")
    parser.add_argument("--stream-share", type=float, default=0.3)
    parser.add_argument("--deadline-share", type=float, default=0.1)
    parser.add_argument("--deadline-s", type=float, nargs=2, default=(0.2, 2.0), help="timeout range")
    parser.add_argument("--cancel-share", type=float, default=0.1)
    parser.add_argument("--cancel-after-s", type=float, nargs=2, default=(0.2, 2.0))
    parser.add_argument("--answer-timeout", type=float, default=180.0, help="seconds until lost")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "soak")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)

    ensure_tiny_models(ROOT)
    pool = build_prompt_pool(load_profile(PROFILE).workload)

    log_path = args.out / "tritonserver.log"
    log_path.unlink(missing_ok=True)
    process = TritonProcess(ServerOptions(root=ROOT, config_name="cpu", ports=Ports.free()))
    logger.info("starting tritonserver (cpu config), log %s", log_path)
    try:
        process.start(log_path)
        process.wait_ready(300)
        logger.info("ready: tritonserver %d, stubs %s", process.process.pid, process.stub_pids())
        if args.capacity:
            capacity, source = args.capacity, "--capacity"
        else:
            capacity, source = measure_capacity(process, pool, args)
        rate = args.load * capacity
        logger.info("capacity %.2f req/s (%s); offered %.2f req/s", capacity, source, rate)
        run = asyncio.run(drive(process, pool, rate, args))
    finally:
        process.stop()
        logger.info("tritonserver stopped")

    summary = summarise(run, log_path)
    header = (
        f"Soak: {args.minutes:g} min at {args.load:g} × {capacity:.2f} req/s ({source}) = {rate:.2f} req/s, "
        f"warm-up {args.warmup_minutes:g} min, mixed workload ({PROFILE.relative_to(ROOT)})"
    )
    table = markdown(summary, header)
    print(table)
    (args.out / "soak.md").write_text(table + "\n")
    config = {k: str(v) for k, v in vars(args).items()}
    run_info = {"capacity_rps": capacity, "capacity_source": source, "rate_rps": rate, "summary": summary}
    document = {"config": config, **run_info, **run, "records": [asdict(r) for r in run["records"]]}
    (args.out / "soak.json").write_text(json.dumps(document, indent=1))
    plot(run, args.out / "soak.png", f"soak at {rate:.2f} req/s; warm-up shaded")
    logger.info("wrote %s, soak.md, soak.png", args.out / "soak.json")
    total = summary["counts"]["total"]
    return 1 if total["lost"] or total["duplicates"] else 0


if __name__ == "__main__":
    sys.exit(main())
