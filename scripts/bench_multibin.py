"""Multi-bin batching in the live server, against what the step simulator predicts for it.

The papers' setting (``admission: multibin``: an idle instance runs one length bin's batch
of B prompts to completion before the next) on a real tritonserver (cpu config, two
instances), for each number of bins k: bursts of N infobench prompts whose lengths the
clients set (max_tokens drawn uniformly from [lo, hi], prompts the length predictor
expects to run longer, so the prediction the scheduler bins by is the requested length),
served with target-only decoding so that a row gets one token per step as the simulator
assumes. B is fixed (b_SLA off). Throughput is N over the burst's makespan, the median
of ``--rounds`` bursts after an untimed warm-up burst that also teaches the bins their
equal-mass edges.

The prediction: the step-level simulator (``specbatch.scheduling.simulate.continuous``)
runs the same ``AdmissionPolicy`` (multibin, same k, B and flush time) on the same
requests (their prompt tokens, the output tokens the server produced, the same
predictions), warm-up first, with step costs fitted from the live k = 1 bursts: within a
batch, the time between successive row finishes against the rows still running, and the
gap between batches against the prompt tokens the next batch prefills. Reported: live
and predicted throughput per k, and the gain of each k over k = 1, live and predicted.

    .venv/bin/python scripts/bench_multibin.py --out results/multibin.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_policies import Setup, TimedRequest, drive, start_server  # noqa: E402

from specbatch.decoding.tiny import BENCH_SPEC, build_controlled_pair  # noqa: E402
from specbatch.figures import save_figure  # noqa: E402
from specbatch.routing import build_infobench_prompt, generate_workload  # noqa: E402
from specbatch.routing.length import LengthPredictor  # noqa: E402
from specbatch.scheduling.admission import AdmissionConfig, AdmissionPolicy  # noqa: E402
from specbatch.scheduling.simulate.continuous import (  # noqa: E402
    ContinuousSimulator,
    SimInstance,
    SimRequest,
    StepCosts,
)

logger = logging.getLogger("bench_multibin")
SERVER_INSTANCES = 2


def build_bursts(args: argparse.Namespace) -> list[list[TimedRequest]]:
    """The warm-up burst, then one burst per round: prompts the predictor expects to run
    past ``hi`` (so max_tokens is the prediction), lengths uniform in [lo, hi]."""
    rng = random.Random(args.seed)
    predictor = LengthPredictor()
    count = args.warmup + args.rounds * args.requests
    prompts: list[str] = []
    for attempt in range(50):
        for generated in generate_workload(4 * count, args.seed + attempt, mix={"infobench": 1.0}):
            text = build_infobench_prompt(generated.text)
            if predictor.predict(text, "infobench") >= args.hi:
                prompts.append(text)
        if len(prompts) >= count:
            break
    if len(prompts) < count:
        raise SystemExit(f"only {len(prompts)} prompts are predicted past {args.hi} tokens")
    requests = [TimedRequest(0.0, text, rng.randint(args.lo, args.hi)) for text in prompts[:count]]
    bursts = [requests[: args.warmup]]
    for start in range(args.warmup, count, args.requests):
        bursts.append(requests[start : start + args.requests])
    return bursts


def pair_env(args: argparse.Namespace) -> dict[str, str]:
    """The model pair's overrides of the cpu config: none for the embedded tiny pair; the
    12-layer controlled pair (built once, like bench_lookahead's) otherwise."""
    if args.pair == "tiny":
        return {}
    target, draft = build_controlled_pair(args.models / "controlled_bench" / "a90", BENCH_SPEC, 0.9)
    return {"SPECBATCH_TARGET_MODEL": str(target.resolve()), "SPECBATCH_DRAFT_MODEL": str(draft.resolve())}


def server_env(args: argparse.Namespace, bins: int) -> dict[str, str]:
    return {
        **pair_env(args),
        "SPECBATCH_ADMISSION": "multibin",
        "SPECBATCH_NUM_BINS": str(bins),
        "SPECBATCH_BATCH_SIZE_MAX": str(args.batch),
        "SPECBATCH_B_SLA": "off",
        "SPECBATCH_MULTIBIN_FLUSH_MS": f"{args.flush_ms:g}",
        "SPECBATCH_MAX_TOKENS_CAP": str(args.hi),
        "SPECBATCH_QUEUE_LIMIT": str(4 * args.requests),
        "SPECBATCH_QUEUE_MIN": str(4 * args.requests),
        "SPECBATCH_GENERATION_MODE": "target_only",
        "SPECBATCH_SLA_E2E_MS": "600000",
    }


def run_live(args: argparse.Namespace, bins: int, bursts: list[list[TimedRequest]]) -> list[list[dict]]:
    """Every burst through one server with k bins; the records of each burst."""
    setup = Setup("multibin", f"multibin k={bins}", {"env": server_env(args, bins)})
    process = start_server(setup, f"multibin-k{bins}")
    results = []
    try:
        for index, burst in enumerate(bursts):
            began = time.monotonic()
            records = drive(process.grpc_url, setup, burst, timeout_s=args.timeout)
            failed = [r for r in records if r["id"] is None]
            if failed or len(records) != len(burst):
                raise SystemExit(f"k={bins} burst {index}: {len(failed)} errors, {len(records)}/{len(burst)}")
            logger.info(
                "k=%d burst %d: %d requests in %.1f s", bins, index, len(burst), time.monotonic() - began
            )
            results.append(records)
    finally:
        process.stop()
    return results


def makespan(records: list[dict]) -> float:
    return max(r["done_s"] for r in records)


def fit_step_costs(bursts_records: list[list[dict]], flush_s: float) -> StepCosts:
    """Step costs from live k = 1 timelines: per instance, batches are the rows whose first
    token came after the previous batch's last row finished."""
    intervals, gaps, prefills = [], [], []
    for records in bursts_records:
        by_instance: dict[str, list[dict]] = {}
        for record in records:
            by_instance.setdefault(record["instance"], []).append(record)
        for rows in by_instance.values():
            rows.sort(key=lambda r: r["first_s"])
            batches: list[list[dict]] = []
            for row in rows:
                if batches and row["first_s"] < max(r["done_s"] for r in batches[-1]):
                    batches[-1].append(row)
                else:
                    batches.append([row])
            for previous, batch in zip([None, *batches], batches, strict=False):
                batch.sort(key=lambda r: r["output_tokens"])
                time_s, tokens = min(r["first_s"] for r in batch), 1
                for position, row in enumerate(batch):
                    steps = row["output_tokens"] - tokens
                    if steps > 0 and row["done_s"] > time_s:
                        intervals.append((len(batch) - position, steps, row["done_s"] - time_s))
                    time_s, tokens = max(time_s, row["done_s"]), row["output_tokens"]
                if previous is not None:
                    gap = min(r["first_s"] for r in batch) - max(r["done_s"] for r in previous)
                    if gap < flush_s:  # a batch that waited for its bin to flush says nothing of cost
                        gaps.append(gap)
                        prefills.append(sum(r["input_tokens"] for r in batch))
    rows = np.array([i[0] for i in intervals], dtype=float)
    steps = np.array([i[1] for i in intervals], dtype=float)
    seconds = np.array([i[2] for i in intervals], dtype=float)
    (base, per_row), *_ = np.linalg.lstsq(np.stack([steps, steps * rows], axis=1), seconds, rcond=None)
    per_prefill = max(0.0, statistics.median(gaps) - base) / statistics.mean(prefills) if gaps else 0.0
    return StepCosts(
        base_s=max(float(base), 1e-6), per_row_s=max(float(per_row), 0.0), per_prefill_token_s=per_prefill
    )


def predict(args: argparse.Namespace, bins: int, live: list[list[dict]], costs: StepCosts) -> list[float]:
    """Simulated makespans of the timed bursts, each arriving once the one before is done."""
    config = AdmissionConfig(
        order="multibin",
        num_bins=bins,
        max_rows=args.batch,
        sla_aware=False,
        shed_deadlines=False,
        queue_limit=4 * args.requests,
        queue_min=4 * args.requests,
        max_predicted_tokens=float(args.hi),
        flush_s=args.flush_ms / 1000.0,
    )
    simulator = ContinuousSimulator(
        lambda: AdmissionPolicy(config),
        [SimInstance(kv_tokens=1 << 20, max_rows=args.batch)] * SERVER_INSTANCES,
        costs,
    )
    requests, starts, arrival, next_id = [], [], 0.0, 0
    spans = []
    for records in live:
        starts.append((arrival, [next_id + i for i in range(len(records))]))
        for record in sorted(records, key=lambda r: r["id"]):
            max_tokens = record["max_tokens"]
            requests.append(
                SimRequest(
                    next_id, arrival, record["input_tokens"], record["output_tokens"], float(max_tokens)
                )
            )
            next_id += 1
        outcomes = {o.request.request_id: o for o in simulator.run(requests)}
        arrival = max(o.done_s for o in outcomes.values()) + 1.0
    for begin, ids in starts[1:]:
        spans.append(max(outcomes[i].done_s for i in ids) - begin)
    return spans


def commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()


def table(rows: list[dict]) -> str:
    lines = [
        "| k | live req/s (median, range) | predicted req/s | live gain over k = 1 "
        "| predicted gain | error of the gain |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['bins']} | {row['live_rps']:.2f} ({row['live_rps_min']:.2f}-{row['live_rps_max']:.2f}) "
            f"| {row['predicted_rps']:.2f} | {row['live_gain']:.3f}x | {row['predicted_gain']:.3f}x "
            f"| {100 * (row['live_gain'] - row['predicted_gain']) / row['predicted_gain']:+.1f} % |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    bins = [row["bins"] for row in rows]
    base = rows[0]["live_rps"]
    gains = [row["live_gain"] for row in rows]
    spread = [
        [gain - row["live_rps_min"] / base for gain, row in zip(gains, rows, strict=True)],
        [row["live_rps_max"] / base - gain for gain, row in zip(gains, rows, strict=True)],
    ]
    axis.errorbar(
        bins, gains, yerr=spread, fmt="o-", capsize=4, label="live tritonserver (median, range of bursts)"
    )
    axis.plot(bins, [row["predicted_gain"] for row in rows], "s--", label="step simulator, fitted at k = 1")
    axis.set_xlabel("length bins k")
    axis.set_ylabel("throughput / throughput at k = 1")
    axis.set_xticks(bins)
    axis.set_title(title)
    axis.legend()
    save_figure(figure, path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--pair",
        choices=("tiny", "a90-12L"),
        default="a90-12L",
        help="a90-12L: the 12-layer controlled pair, whose step time is mostly per step, not per row",
    )
    parser.add_argument("--models", type=Path, default=ROOT / ".models", help="root of controlled_bench/")
    parser.add_argument("--bins", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--batch", type=int, default=8, help="B: rows per batch")
    parser.add_argument("--requests", type=int, default=128, help="prompts per timed burst")
    parser.add_argument("--warmup", type=int, default=64, help="prompts of the untimed first burst")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lo", type=int, default=16)
    parser.add_argument("--hi", type=int, default=128)
    parser.add_argument("--flush-ms", type=float, default=500.0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="k 1 and 4, 64 prompts, 1 round")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "multibin.json")
    parser.add_argument("--figure", type=Path, default=ROOT / "docs" / "img" / "multibin_live.png")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = build_parser().parse_args(argv)
    if args.quick:
        args.bins, args.requests, args.warmup, args.rounds = [1, 4], 64, 64, 1
    if args.bins[0] != 1:
        raise SystemExit("--bins must start at 1: the step costs are fitted there and gains are over it")
    started_at = commit()  # the code that runs, whatever lands while it does
    bursts = build_bursts(args)
    live: dict[int, list[list[dict]]] = {}
    for bins in args.bins:
        live[bins] = run_live(args, bins, bursts)
        for burst, records in zip(bursts, live[bins], strict=True):
            for record in records:
                record["max_tokens"] = burst[record["id"]].max_tokens
    costs = fit_step_costs(live[1][1:], args.flush_ms / 1000.0)
    logger.info("step costs fitted at k = 1: %s", costs)
    for bins in args.bins[1:]:  # what the same fit reads off the other runs, for the record
        logger.info(
            "the same fit at k = %d: %s", bins, fit_step_costs(live[bins][1:], args.flush_ms / 1000.0)
        )
    rows = []
    for bins in args.bins:
        spans = [makespan(records) for records in live[bins][1:]]
        predicted = predict(args, bins, live[bins], costs)
        rates = [args.requests / s for s in spans]
        rows.append(
            {
                "bins": bins,
                "live_rps": statistics.median(rates),
                "live_rps_min": min(rates),
                "live_rps_max": max(rates),
                "predicted_rps": statistics.median(args.requests / s for s in predicted),
                "rows_cut_at_max_tokens": sum(
                    r["output_tokens"] == r["max_tokens"] for burst in live[bins][1:] for r in burst
                )
                / (args.rounds * args.requests),
            }
        )
    for row in rows:
        row["live_gain"] = row["live_rps"] / rows[0]["live_rps"]
        row["predicted_gain"] = row["predicted_rps"] / rows[0]["predicted_rps"]
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "commit": started_at,
        "date": time.strftime("%Y-%m-%d"),
        "pair": args.pair,
        "batch": args.batch,
        "requests": args.requests,
        "rounds": args.rounds,
        "lengths": [args.lo, args.hi],
        "step_costs": dataclasses.asdict(costs),
    }
    records = {str(bins): bursts_records for bins, bursts_records in live.items()}
    args.out.write_text(json.dumps({"meta": meta, "rows": rows, "records": records}, indent=1))
    plot(
        rows,
        args.figure,
        f"multibin live vs simulated (B = {args.batch}, U({args.lo}, {args.hi})), {args.pair}",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
