"""Admission policies against Triton's own batcher, on a real tritonserver, same arrivals.

Three set-ups serve the same open-loop Poisson streams of mixed-length infobench
prompts (same prompts, same max_tokens, same arrival times):

  (a) least_slack      the specbatch ensemble: its scheduler admits per instance
                       (bins, least slack first, min(b_mem, b_SLA), bounded queue)
                       over continuous-batching instances
  (b) fcfs             the same instances, admission first-come first-served with no
                       bins, no SLA cap and no queue bound (what vLLM does)
  (c) triton_batching  qwen3_specdec called directly, static batches formed by Triton's
                       dynamic_batching (configs/cpu_triton_batching.pbtxt)

The capacity of (c) is measured first (its throughput under sustained overload); every
set-up then runs at 0.8x, 1.0x and 1.2x of it. A request meets its SLA when its first token comes within
--sla-ttft-s and it ends within --sla-base-s + --sla-per-token-s x max_tokens; (a) and
(b) stream (first token = first delta), (c) cannot (first token = its answer). (a) is
configured with that first-token SLA (sla_ttft_ms) and keeps its per-token target
(sla_tpot_ms of the cpu config: the per-token budget here is an end-to-end one). Also
reported: CPU seconds per request spent in the router and scheduler processes.
Prints a table, writes JSON and a PNG.

    .venv/bin/python scripts/bench_policies.py --duration 40 --out results/bench_policies.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from specbatch.figures import save_figure  # noqa: E402
from specbatch.routing import build_infobench_prompt, generate_workload  # noqa: E402
from specbatch.server.launcher import ensure_tiny_models  # noqa: E402
from specbatch.server.process import Ports, ServerOptions, TritonProcess  # noqa: E402

logger = logging.getLogger("bench_policies")


@dataclass(frozen=True)
class TimedRequest:
    at_s: float
    prompt: str
    max_tokens: int


@dataclass(frozen=True)
class Setup:
    name: str
    label: str
    options: dict


SETUPS = (
    Setup("least_slack", "(a) specbatch admission", {}),
    Setup(
        "fcfs",
        "(b) first-come first-served",
        {"env": {"SPECBATCH_ADMISSION": "fcfs", "SPECBATCH_QUEUE_LIMIT": "1000000"}},
    ),
    Setup(
        "triton_batching",
        "(c) Triton dynamic_batching",
        {"only_model": "qwen3_specdec", "config_name": "cpu_triton_batching"},
    ),
)
LOADS = (0.8, 1.0, 1.2)


def build_workload(rate: float, duration_s: float, seed: int, short_share: float) -> list[TimedRequest]:
    """Poisson arrivals; max_tokens bimodal (many short answers, some long ones)."""
    rng = random.Random(seed)
    times, now = [], 0.0
    while True:
        now += rng.expovariate(rate)
        if now >= duration_s:
            break
        times.append(now)
    prompts = [p.text for p in generate_workload(len(times), seed, mix={"infobench": 1.0})]
    return [
        TimedRequest(
            t,
            build_infobench_prompt(p),
            rng.randint(8, 32) if rng.random() < short_share else rng.randint(96, 192),
        )
        for t, p in zip(times, prompts, strict=True)
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
    return "specbatch", [
        tensor("text_input", np.array([[arrival.prompt.encode()]], dtype=np.object_), "BYTES"),
        tensor("max_tokens", np.array([[arrival.max_tokens]], dtype=np.int32), "INT32"),
        tensor("task_override", np.array([[b"infobench"]], dtype=np.object_), "BYTES"),
        tensor("stream", np.array([[True]]), "BOOL"),
    ]


def drive(url: str, setup: Setup, arrivals: list[TimedRequest], timeout_s: float) -> list[dict]:
    """Send every arrival on time over one gRPC stream; one record per request, from its
    first response (first token) and its final one."""
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
            records.append({"id": None, "error": str(error)})
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


def summarise(
    setup: Setup, rate: float, arrivals: list[TimedRequest], records: list[dict], args: argparse.Namespace
) -> dict:
    served = [r for r in records if r["id"] is not None]
    span = max([arrivals[-1].at_s] + [r["done_s"] for r in served])
    met = [
        r
        for r in served
        if r["ttft_s"] <= args.sla_ttft_s
        and r["e2e_s"] <= args.sla_base_s + args.sla_per_token_s * arrivals[r["id"]].max_tokens
    ]
    return {
        "setup": setup.name,
        "label": setup.label,
        "rate": rate,
        "offered": len(arrivals),
        "completed": len(served),
        "errors": len(records) - len(served),
        "lost": len(arrivals) - len(records),
        "throughput_rps": len(served) / span,
        "goodput_rps": len(met) / span,
        "sla_met": len(met) / len(arrivals),
        "ttft_p95_s": percentile([r["ttft_s"] for r in served], 95),
        "e2e_p99_s": percentile([r["e2e_s"] for r in served], 99),
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


def start_server(setup: Setup, name: str) -> TritonProcess:
    options = ServerOptions(
        root=ROOT,
        host="127.0.0.1",
        ports=Ports.free(),
        exit_timeout_s=5,
        config_name=setup.options.get("config_name", "cpu"),
        env=setup.options.get("env", {}),
        only_model=setup.options.get("only_model"),
    )
    process = TritonProcess(options)
    process.start(Path(tempfile.mkdtemp(prefix="bench_policies_")) / f"{name}.log")
    process.wait_ready(300)
    return process


def run_setup(setup: Setup, rate: float, arrivals: list[TimedRequest], args: argparse.Namespace) -> dict:
    if setup.name == "least_slack":  # the scheduler is told the first-token SLA it is held to
        sla = {"SPECBATCH_SLA_TTFT_MS": f"{args.sla_ttft_s * 1000:g}"}
        setup = Setup(
            setup.name, setup.label, {**setup.options, "env": {**setup.options.get("env", {}), **sla}}
        )
    process = start_server(setup, f"{setup.name}-{rate:.1f}")
    try:
        drive(process.grpc_url, setup, arrivals[: min(4, len(arrivals))], timeout_s=120)
        logger.info(
            "%s at %.1f/s: warm; %d requests over %.0f s", setup.name, rate, len(arrivals), args.duration
        )
        cpu_before = cpu_seconds(process)
        records = drive(process.grpc_url, setup, arrivals, timeout_s=args.drain)
        cpu = cpu_seconds(process) - cpu_before
    finally:
        process.stop()
    row = summarise(setup, rate, arrivals, records, args)
    row["router_scheduler_cpu_s_per_request"] = (
        cpu / len(arrivals) if setup.name != "triton_batching" else None
    )
    return row


def measure_capacity(args: argparse.Namespace) -> float:
    """Requests per second (c) completes under sustained overload (Poisson arrivals at
    --capacity-probe-rate): the most its static batches serve."""
    setup = next(s for s in SETUPS if s.name == "triton_batching")
    arrivals = build_workload(
        args.capacity_probe_rate, args.capacity_probe_s, args.seed + 1, args.short_share
    )
    process = start_server(setup, "capacity")
    try:
        drive(process.grpc_url, setup, arrivals[:4], timeout_s=120)
        records = drive(process.grpc_url, setup, arrivals, timeout_s=args.drain)
    finally:
        process.stop()
    served = [r for r in records if r["id"] is not None]
    return len(served) / max(r["done_s"] for r in served)


def table(rows: list[dict]) -> str:
    lines = [
        "| load | set-up | completed | throughput req/s | goodput req/s | goodput vs (c) | SLA met "
        "| TTFT p95 s | e2e p99 s | router+scheduler CPU ms/req |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        reference = next(x for x in rows if x["rate"] == r["rate"] and x["setup"] == "triton_batching")
        ratio = r["goodput_rps"] / reference["goodput_rps"] if reference["goodput_rps"] else float("inf")
        cpu = r["router_scheduler_cpu_s_per_request"]
        cpu_ms = "—" if cpu is None else f"{cpu * 1000:.1f}"
        lines.append(
            f"| {r['load']:.1f}× ({r['rate']:.1f}/s) | {r['label']} | {r['completed']}/{r['offered']} "
            f"| {r['throughput_rps']:.2f} | {r['goodput_rps']:.2f} | ×{ratio:.2f} | {r['sla_met']:.0%} "
            f"| {r['ttft_p95_s']:.2f} | {r['e2e_p99_s']:.2f} | {cpu_ms} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for setup in SETUPS:
        mine = [r for r in rows if r["setup"] == setup.name]
        if not mine:
            continue
        loads = [r["load"] for r in mine]
        left.plot(loads, [r["goodput_rps"] for r in mine], marker="o", label=setup.label)
        right.plot(loads, [r["ttft_p95_s"] for r in mine], marker="o", label=setup.label)
    left.set_xlabel("offered load (× capacity of (c))")
    left.set_ylabel("goodput (requests/s within SLA)")
    right.set_xlabel("offered load (× capacity of (c))")
    right.set_ylabel("TTFT p95 (s)")
    right.set_yscale("log")
    left.legend()
    fig.suptitle(title)
    save_figure(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals per run")
    parser.add_argument("--capacity", type=float, help="capacity of (c) in requests/s (measured if left out)")
    parser.add_argument(
        "--capacity-probe-rate", type=float, default=10.0, help="overload rate of the capacity run"
    )
    parser.add_argument(
        "--capacity-probe-s", type=float, default=20.0, help="seconds of arrivals of the capacity run"
    )
    parser.add_argument("--loads", type=float, nargs="+", default=list(LOADS))
    parser.add_argument("--drain", type=float, default=180.0, help="seconds to wait for stragglers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--short-share", type=float, default=0.6, help="share of 8–32-token requests")
    parser.add_argument("--sla-ttft-s", type=float, default=2.0)
    parser.add_argument("--sla-base-s", type=float, default=0.5)
    parser.add_argument("--sla-per-token-s", type=float, default=0.01)
    parser.add_argument("--only", choices=[s.name for s in SETUPS], action="append")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_policies.json")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "bench_policies.png")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    ensure_tiny_models(ROOT)
    capacity = args.capacity or measure_capacity(args)
    logger.info("capacity of (c): %.2f requests/s", capacity)
    setups = [s for s in SETUPS if not args.only or s.name in args.only or s.name == "triton_batching"]
    runs = [(load, setup) for load in args.loads for setup in setups]
    rows = []
    for number, (load, setup) in enumerate(runs, 1):
        rate = load * capacity
        logger.info("[%d/%d] %s at %.1f× (%.2f/s)", number, len(runs), setup.label, load, rate)
        arrivals = build_workload(rate, args.duration, args.seed, args.short_share)
        rows.append(run_setup(setup, rate, arrivals, args) | {"load": load})
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"config": {k: str(v) for k, v in vars(args).items()}, "capacity_rps": capacity, "rows": rows},
            indent=2,
        )
    )
    plot(
        rows, args.plot, f"Poisson arrivals at 0.8–1.2× the capacity of (c) ({capacity:.1f}/s), same prompts"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
