"""multi_bin_dynamic vs multi_bin_only vs dynamic_only vs FIFO static on one workload, same seeds.

- multi_bin_dynamic: 4 equal-mass bins, batch size min(b_mem, b_SLA);
- multi_bin_only: 4 equal-mass bins, static B = 16 (fixed-B batches, flush window);
- dynamic_only: one FIFO queue, batch size min(b_mem, b_SLA);
- fifo_static: one FIFO queue, static B = 16.

Every policy sees the same arrays (same seeds): Poisson arrivals swept over offered load, plus
a BurstGPT-like ON/OFF workload whose bursts exceed capacity while its mean does not.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tqdm import tqdm

from specbatch.scheduling.simulate.engine import Simulator
from specbatch.scheduling.simulate.experiments.common import (
    ExperimentOutput,
    ServingScenario,
    markdown_table,
    mean_of,
    write_json,
)
from specbatch.scheduling.simulate.plots import plot_policy_comparison
from specbatch.scheduling.simulate.workload import OnOffArrivals, PoissonArrivals, make_workload

logger = logging.getLogger(__name__)

STATIC_B = 16
NUM_BINS = 4
RATES = (1.5, 2.0, 2.5, 3.0, 3.5)
BURSTY = OnOffArrivals(rate_on=5.0, rate_off=0.5, mean_on_s=30.0, mean_off_s=60.0)
METRICS = (
    "offered_rps",
    "throughput_rps",
    "goodput_rps",
    "token_throughput",
    "latency_p50_s",
    "latency_p95_s",
    "latency_p99_s",
    "sla_violation_rate",
    "utilisation",
    "mean_batch_size",
)


def run(out_dir: Path, *, quick: bool, seed: int) -> ExperimentOutput:
    scenario = ServingScenario()
    policies = {
        "multi_bin_dynamic": scenario.dynamic_policy(num_bins=NUM_BINS),
        "multi_bin_only": scenario.static_policy(STATIC_B, num_bins=NUM_BINS),
        "dynamic_only": scenario.dynamic_policy(num_bins=1),
        "fifo_static": scenario.static_policy(STATIC_B, num_bins=1),
    }
    horizon = 1_800.0 if quick else 3_600.0
    seeds = [seed] if quick else [seed, seed + 1, seed + 2]
    workloads = [(f"Poisson {rate:g}/s", PoissonArrivals(rate)) for rate in ((2.0, 3.0) if quick else RATES)]
    workloads.append((f"ON/OFF mean {BURSTY.mean_rate_per_s:.2f}/s", BURSTY))
    jobs = [(w, s, name) for w in range(len(workloads)) for s in seeds for name in policies]
    runs: dict[tuple[int, str], list[dict]] = {}
    for index, run_seed, name in tqdm(jobs, desc="policy_comparison", unit="run"):
        workload = make_workload(
            workloads[index][1],
            scenario.output_lengths,
            scenario.predictor,
            horizon,
            run_seed,
            input_lengths=scenario.input_lengths,
            relative_deadline_s=scenario.deadline_s,
        )
        result = Simulator(policies[name], scenario.cluster).run(
            workload, horizon, warmup_s=0.1 * horizon, drain_s=scenario.deadline_s
        )
        record = {key: getattr(result.metrics, key) for key in METRICS}
        record["peak_kv_fraction"] = result.metrics.peak_kv_demand_tokens / scenario.kv_capacity_tokens
        runs.setdefault((index, name), []).append(record)
    rows = [
        {
            "workload": workloads[index][0],
            "policy": name,
            "seeds": len(records),
            **{key: mean_of(records, key) for key in records[0]},
            "peak_kv_fraction": max(r["peak_kv_fraction"] for r in records),
        }
        for (index, name), records in runs.items()
    ]
    logger.info("policy_comparison: %d runs", len(jobs))
    json_path = write_json(out_dir / "policy_comparison.json", rows)
    poisson_rows = [r for r in rows if r["workload"].startswith("Poisson")]
    figure = plot_policy_comparison(
        sorted(poisson_rows, key=lambda r: (list(policies).index(r["policy"]), r["offered_rps"])),
        out_dir / "sched_policy_comparison.png",
    )
    headers = [
        "workload",
        "policy",
        "throughput (req/s)",
        "goodput (req/s)",
        "tokens/s",
        "p50 (s)",
        "p95 (s)",
    ]
    headers += ["p99 (s)", "SLA viol.", "util.", "mean b", "peak KV / η"]
    table = markdown_table(
        headers,
        [
            [
                r["workload"],
                r["policy"],
                r["throughput_rps"],
                r["goodput_rps"],
                r["token_throughput"],
                r["latency_p50_s"],
                r["latency_p95_s"],
                r["latency_p99_s"],
                f"{100 * r['sla_violation_rate']:.1f} %",
                r["utilisation"],
                r["mean_batch_size"],
                r["peak_kv_fraction"],
            ]
            for r in rows
        ],
    )
    return ExperimentOutput("policy_comparison", [table], json_path, [figure])
