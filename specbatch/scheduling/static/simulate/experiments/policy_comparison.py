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

from specbatch.scheduling.static.simulate.experiments.scenarios import (
    ServingScenario,
    over_seeds,
    serving_table,
)
from specbatch.scheduling.static.simulate.plots import plot_policy_comparison
from specbatch.scheduling.static.simulate.report import ExperimentOutput, write_json
from specbatch.scheduling.static.simulate.workload import OnOffArrivals, PoissonArrivals

logger = logging.getLogger(__name__)

STATIC_B = 16
NUM_BINS = 4
POISSON_RATES_RPS = (1.5, 2.0, 2.5, 3.0, 3.5)
BURSTY = OnOffArrivals(rate_on=5.0, rate_off=0.5, mean_on_s=30.0, mean_off_s=60.0)


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
    rates = (2.0, 3.0) if quick else POISSON_RATES_RPS
    workloads = [(f"Poisson {rate:g}/s", PoissonArrivals(rate)) for rate in rates]
    workloads.append((f"ON/OFF mean {BURSTY.mean_rate_per_s:.2f}/s", BURSTY))
    jobs = [(w, s, name) for w in range(len(workloads)) for s in seeds for name in policies]
    runs: dict[tuple[int, str], list[dict]] = {}
    for index, run_seed, name in tqdm(jobs, desc="policy_comparison", unit="run"):
        record = scenario.measure(policies[name], workloads[index][1], horizon, run_seed)
        runs.setdefault((index, name), []).append(record)
    rows = [
        {"workload": workloads[index][0], "policy": name, **over_seeds(records)}
        for (index, name), records in runs.items()
    ]
    logger.info("policy_comparison: %d runs", len(jobs))
    json_path = write_json(out_dir / "policy_comparison.json", rows)
    poisson_rows = [r for r in rows if r["workload"].startswith("Poisson")]
    figure = plot_policy_comparison(
        sorted(poisson_rows, key=lambda r: (list(policies).index(r["policy"]), r["offered_rps"])),
        out_dir / "sched_policy_comparison.png",
    )
    table = serving_table(rows, [("workload", "workload"), ("policy", "policy")])
    return ExperimentOutput("policy_comparison", [table], json_path, [figure])
