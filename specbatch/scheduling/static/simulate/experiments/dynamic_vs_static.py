"""Dynamic batch size (min(b_mem, b_SLA)) against static B on the same serving workload.

Part 1: the same Poisson workloads (same seeds) under static B = 4 … 64 (plain FIFO) and
under dynamic batching, with and without the SLA controller. Part 2: a load step from
0.8 to 2.0 req/s half-way through, to watch the dynamic batch size converge.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tqdm import tqdm

from specbatch.scheduling.static.simulate.engine import Simulator
from specbatch.scheduling.static.simulate.experiments.scenarios import (
    ServingScenario,
    over_seeds,
    serving_table,
)
from specbatch.scheduling.static.simulate.plots import plot_batch_size_trace
from specbatch.scheduling.static.simulate.report import ExperimentOutput, format_markdown_table, write_json
from specbatch.scheduling.static.simulate.workload import PoissonArrivals, StepArrivals

logger = logging.getLogger(__name__)

STATIC_SIZES = (4, 8, 16, 32, 64)
STEADY_RATES_RPS = (1.5, 2.0, 2.5)
STEP_RATES_RPS = (0.8, 2.0)


def run(out_dir: Path, *, quick: bool, seed: int) -> ExperimentOutput:
    scenario = ServingScenario()
    horizon = 1_800.0 if quick else 3_600.0
    seeds = [seed] if quick else [seed, seed + 1, seed + 2]
    policies = {f"static B={b}": scenario.static_policy(b) for b in STATIC_SIZES}
    policies["dynamic b_mem"] = scenario.dynamic_policy(use_sla=False)
    policies["dynamic min(b_mem, b_SLA)"] = scenario.dynamic_policy()
    jobs = [(rate, name, s) for rate in STEADY_RATES_RPS for name in policies for s in seeds]
    runs: dict[tuple[float, str], list[dict]] = {}
    for rate, name, run_seed in tqdm(jobs, desc="dynamic_vs_static", unit="run"):
        record = scenario.measure(policies[name], PoissonArrivals(rate), horizon, run_seed)
        runs.setdefault((rate, name), []).append(record)
    rows = [{"rate_rps": rate, "policy": name, **over_seeds(v)} for (rate, name), v in runs.items()]
    comparison = serving_table(rows, [("load (req/s)", "rate_rps"), ("policy", "policy")])
    step_summary, figure = _load_step(scenario, out_dir, horizon, seed)
    step_table = format_markdown_table(
        ["phase", "load (req/s)", "mean batch size", "mean b_SLA", "mean b_mem", "batches with TPOT > SLA"],
        [
            [
                p["phase"],
                p["rate_rps"],
                p["mean_batch_size"],
                p["mean_b_sla"],
                p["mean_b_mem"],
                p["slow_batches"],
            ]
            for p in step_summary
        ],
    )
    json_path = write_json(
        out_dir / "dynamic_vs_static.json", {"comparison": rows, "load_step": step_summary}
    )
    return ExperimentOutput("dynamic_vs_static", [comparison, step_table], json_path, [figure])


def _load_step(
    scenario: ServingScenario, out_dir: Path, horizon: float, seed: int
) -> tuple[list[dict], Path]:
    """Run the dynamic policy through a load step; summarise each phase and plot the batch sizes."""
    step_s = horizon / 2
    arrivals = StepArrivals(((0.0, STEP_RATES_RPS[0]), (step_s, STEP_RATES_RPS[1])))
    result = Simulator(scenario.dynamic_policy(), scenario.cluster).run(
        scenario.workload(arrivals, horizon, seed), horizon, drain_s=0.0
    )
    phases = [
        ("before the step", STEP_RATES_RPS[0], 0.0, step_s),
        ("first quarter after", STEP_RATES_RPS[1], step_s, step_s + horizon / 8),
        ("last quarter after", STEP_RATES_RPS[1], horizon - horizon / 8, horizon),
    ]
    summary = []
    for phase, rate, start, end in phases:
        batches = [b for b in result.batches if start <= b.start_s < end]
        summary.append(
            {
                "phase": phase,
                "rate_rps": rate,
                "mean_batch_size": sum(b.size for b in batches) / max(len(batches), 1),
                "mean_b_sla": sum(b.b_sla for b in batches) / max(len(batches), 1),
                "mean_b_mem": sum(b.b_mem for b in batches) / max(len(batches), 1),
                "slow_batches": sum(1 for b in batches if b.step_seconds > scenario.sla_tpot_s),
            }
        )
    logger.info("load step: %s", summary)
    figure = plot_batch_size_trace(
        result.batches,
        step_s,
        {"static B=16": 16.0, "static B=32": 32.0},
        out_dir / "sched_dynamic_batch_size.png",
    )
    return summary, figure
