"""Scheduler policies against Triton's own batcher, on a real tritonserver, same workload.

Three set-ups serve the same open-loop Poisson stream of mixed-length infobench
prompts (same prompts, same max_tokens, same arrival times):

  (a) multi_bin_dynamic   the specbatch ensemble with its scheduler as configured (cpu config)
  (b) fifo_static         the same ensemble, scheduler forced to one bin and a fixed batch size
  (c) triton_batching     qwen3_specdec called directly, batched by Triton's dynamic_batching
                          (configs/cpu_triton_batching.pbtxt), no custom scheduler

Each request is held to an end-to-end SLA that scales with its length,
e2e <= sla_base_s + sla_per_token_s * max_tokens; goodput counts the requests that met
it per second. Prints a table, writes JSON and a PNG.

    .venv/bin/python scripts/bench_policies.py --rate 16 --duration 40 --out results/bench_policies.json
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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from specbatch.routing import build_infobench_prompt, generate_workload  # noqa: E402
from specbatch.server.launcher import ensure_tiny_models  # noqa: E402
from specbatch.server.process import Ports, ServerOptions, TritonProcess  # noqa: E402

logger = logging.getLogger("bench_policies")


@dataclass(frozen=True)
class Arrival:
    at_s: float
    prompt: str
    max_tokens: int


@dataclass(frozen=True)
class Setup:
    name: str
    label: str
    options: dict


SETUPS = (
    Setup("multi_bin_dynamic", "(a) multi-bin + dynamic", {}),
    Setup(
        "fifo_static",
        "(b) k = 1, fixed B = 8",
        {"env": {"SPECBATCH_NUM_BINS": "1", "SPECBATCH_FIXED_BATCH_SIZE": "8"}},
    ),
    Setup(
        "triton_batching",
        "(c) Triton dynamic_batching",
        {"only_model": "qwen3_specdec", "config_name": "cpu_triton_batching"},
    ),
)


def build_workload(rate: float, duration_s: float, seed: int, short_share: float) -> list[Arrival]:
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
        Arrival(
            t,
            build_infobench_prompt(p),
            rng.randint(8, 32) if rng.random() < short_share else rng.randint(96, 192),
        )
        for t, p in zip(times, prompts, strict=True)
    ]


def request_inputs(grpcclient, setup: Setup, arrival: Arrival) -> tuple[str, list]:
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
    ]


def drive(url: str, setup: Setup, arrivals: list[Arrival], timeout_s: float) -> list[dict]:
    """Send every arrival on time over one gRPC stream; one record per request."""
    import tritonclient.grpc as grpcclient

    replies: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: replies.put((time.monotonic(), result, error)))
    sent: dict[str, float] = {}
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
            done_at, result, error = replies.get(timeout=1.0)
        except queue.Empty:
            continue
        if error is not None:
            records.append({"id": None, "error": str(error)})
            continue
        response = result.get_response()
        index = int(response.id)
        tokens = int(result.as_numpy("num_output_tokens").reshape(-1)[0])
        records.append(
            {
                "id": index,
                "e2e_s": done_at - sent[response.id],
                "output_tokens": tokens,
                "done_s": done_at - start,
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
    setup: Setup, arrivals: list[Arrival], records: list[dict], base_s: float, per_token_s: float
) -> dict:
    served = [r for r in records if r["id"] is not None]
    window = max(r["done_s"] for r in served) if served else float("nan")
    met = [r for r in served if r["e2e_s"] <= base_s + per_token_s * arrivals[r["id"]].max_tokens]
    e2e = [r["e2e_s"] for r in served]
    return {
        "policy": setup.name,
        "label": setup.label,
        "offered": len(arrivals),
        "completed": len(served),
        "errors": len(records) - len(served),
        "lost": len(arrivals) - len(records),
        "throughput_rps": len(served) / window,
        "goodput_rps": len(met) / window,
        "tokens_per_s": sum(r["output_tokens"] for r in served) / window,
        "sla_met": len(met) / len(arrivals),
        "p50_e2e_s": percentile(e2e, 50),
        "p95_e2e_s": percentile(e2e, 95),
        "p99_e2e_s": percentile(e2e, 99),
    }


def run_setup(setup: Setup, arrivals: list[Arrival], args: argparse.Namespace) -> dict:
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
    log = Path(tempfile.mkdtemp(prefix="bench_policies_")) / f"{setup.name}.log"
    process.start(log)
    try:
        process.wait_ready(300)
        drive(process.grpc_url, setup, arrivals[: min(4, len(arrivals))], timeout_s=120)
        logger.info("%s: warm; sending %d requests over %.0f s", setup.name, len(arrivals), args.duration)
        records = drive(process.grpc_url, setup, arrivals, timeout_s=args.drain)
    finally:
        process.stop()
    return summarise(setup, arrivals, records, args.sla_base_s, args.sla_per_token_s)


def table(rows: list[dict], reference: dict) -> str:
    lines = [
        "| set-up | completed | throughput req/s | goodput req/s | goodput vs (c) | tokens/s | SLA met "
        "| p50 e2e s | p95 e2e s | p99 e2e s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r["goodput_rps"] / reference["goodput_rps"]
        lines.append(
            f"| {r['label']} | {r['completed']}/{r['offered']} | {r['throughput_rps']:.2f} "
            f"| {r['goodput_rps']:.2f} | ×{ratio:.2f} | {r['tokens_per_s']:.0f} | {r['sla_met']:.0%} "
            f"| {r['p50_e2e_s']:.2f} | {r['p95_e2e_s']:.2f} | {r['p99_e2e_s']:.2f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["label"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    x = np.arange(len(rows))
    left.bar(x - 0.2, [r["throughput_rps"] for r in rows], 0.4, label="throughput")
    left.bar(x + 0.2, [r["goodput_rps"] for r in rows], 0.4, label="goodput (SLA met)")
    left.set_xticks(x, labels, fontsize=8)
    left.set_ylabel("requests / s")
    left.legend()
    for offset, key in ((-0.25, "p50_e2e_s"), (0.0, "p95_e2e_s"), (0.25, "p99_e2e_s")):
        right.bar(x + offset, [r[key] for r in rows], 0.25, label=key.split("_")[0])
    right.set_xticks(x, labels, fontsize=8)
    right.set_ylabel("end-to-end latency (s)")
    right.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=16.0, help="offered load, requests/s")
    parser.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals")
    parser.add_argument("--drain", type=float, default=180.0, help="seconds to wait for stragglers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--short-share", type=float, default=0.6, help="share of 8–32-token requests")
    parser.add_argument("--sla-base-s", type=float, default=0.5)
    parser.add_argument("--sla-per-token-s", type=float, default=0.01)
    parser.add_argument("--only", choices=[s.name for s in SETUPS], action="append")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_policies.json")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "bench_policies.png")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    ensure_tiny_models(ROOT)
    arrivals = build_workload(args.rate, args.duration, args.seed, args.short_share)
    setups = [s for s in SETUPS if not args.only or s.name in args.only]
    rows = []
    for number, setup in enumerate(setups, 1):
        logger.info("[%d/%d] %s", number, len(setups), setup.label)
        rows.append(run_setup(setup, arrivals, args))
    reference = next((r for r in rows if r["policy"] == "triton_batching"), rows[-1])
    print(table(rows, reference))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "config": {k: str(v) for k, v in vars(args).items()},
                "arrivals": [asdict(a) | {"prompt": a.prompt[:60]} for a in arrivals[:5]],
                "rows": rows,
            },
            indent=2,
        )
    )
    plot(rows, args.plot, f"{len(arrivals)} requests, Poisson {args.rate}/s, mixed lengths, same arrivals")
    return 0


if __name__ == "__main__":
    sys.exit(main())
