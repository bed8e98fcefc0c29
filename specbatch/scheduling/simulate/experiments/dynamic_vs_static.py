"""Dynamic batch size (min(b_mem, b_SLA)) against static B on the same serving workload.

Part 1: the same Poisson workloads (same seeds) under static B = 4 … 64 (plain FIFO) and
under dynamic batching, with and without the SLA controller. Part 2: a load step from
0.8 to 2.0 req/s half-way through, to watch the dynamic batch size converge.
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
from specbatch.scheduling.simulate.plots import plot_batch_size_trace
from specbatch.scheduling.simulate.workload import PoissonArrivals, StepArrivals, make_workload

logger = logging.getLogger(__name__)

STATIC_SIZES = (4, 8, 16, 32, 64)
RATES = (1.5, 2.0, 2.5)
STEP_RATES = (0.8, 2.0)


def run(out_dir: Path, *, quick: bool, seed: int) -> ExperimentOutput:
    scenario = ServingScenario()
    horizon = 1_800.0 if quick else 3_600.0
    seeds = [seed] if quick else [seed, seed + 1, seed + 2]
    policies = {f"static B={b}": scenario.static_policy(b) for b in STATIC_SIZES}
    policies["dynamic b_mem"] = scenario.dynamic_policy(use_sla=False)
    policies["dynamic min(b_mem, b_SLA)"] = scenario.dynamic_policy()
    jobs = [(rate, name, s) for rate in RATES for name in policies for s in seeds]
    runs: dict[tuple[float, str], list[dict]] = {}
    for rate, name, run_seed in tqdm(jobs, desc="dynamic_vs_static", unit="run"):
        workload = _workload(scenario, PoissonArrivals(rate), horizon, run_seed)
        metrics = (
            Simulator(policies[name], scenario.cluster)
            .run(workload, horizon, warmup_s=0.1 * horizon, drain_s=scenario.deadline_s)
            .metrics
        )
        runs.setdefault((rate, name), []).append(
            {
                "throughput_rps": metrics.throughput_rps,
                "goodput_rps": metrics.goodput_rps,
                "latency_p50_s": metrics.latency_p50_s,
                "latency_p95_s": metrics.latency_p95_s,
                "latency_p99_s": metrics.latency_p99_s,
                "sla_violation_rate": metrics.sla_violation_rate,
                "utilisation": metrics.utilisation,
                "mean_batch_size": metrics.mean_batch_size,
                "peak_kv_fraction": metrics.peak_kv_demand_tokens / scenario.kv_capacity_tokens,
                "kv_overflow_batches": metrics.kv_overflow_batches,
            }
        )
    rows = [
        {"rate_rps": rate, "policy": name, "seeds": len(v), **{k: mean_of(v, k) for k in v[0]}}
        for (rate, name), v in runs.items()
    ]
    rows_by_key = {(r["rate_rps"], r["policy"]): r for r in rows}
    for rate in RATES:
        rows_by_key[rate, "dynamic min(b_mem, b_SLA)"]["peak_kv_fraction"] = max(
            r["peak_kv_fraction"] for r in runs[rate, "dynamic min(b_mem, b_SLA)"]
        )
    comparison = markdown_table(
        [
            "load (req/s)",
            "policy",
            "throughput (req/s)",
            "goodput (req/s)",
            "p50 (s)",
            "p95 (s)",
            "p99 (s)",
            "SLA viol.",
            "util.",
            "mean b",
            "peak KV / η",
            "KV overflow batches / run",
        ],
        [
            [
                r["rate_rps"],
                r["policy"],
                r["throughput_rps"],
                r["goodput_rps"],
                r["latency_p50_s"],
                r["latency_p95_s"],
                r["latency_p99_s"],
                f"{100 * r['sla_violation_rate']:.1f} %",
                r["utilisation"],
                r["mean_batch_size"],
                r["peak_kv_fraction"],
                r["kv_overflow_batches"],
            ]
            for r in rows
        ],
    )
    step_summary, figure = _load_step(scenario, out_dir, horizon, seed)
    step_table = markdown_table(
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


def _workload(scenario: ServingScenario, arrivals: object, horizon: float, seed: int):
    return make_workload(
        arrivals,
        scenario.output_lengths,
        scenario.predictor,
        horizon,
        seed,
        input_lengths=scenario.input_lengths,
        relative_deadline_s=scenario.deadline_s,
    )


def _load_step(
    scenario: ServingScenario, out_dir: Path, horizon: float, seed: int
) -> tuple[list[dict], Path]:
    """Run the dynamic policy through a load step; summarise each phase and plot the batch sizes."""
    step_s = horizon / 2
    arrivals = StepArrivals(((0.0, STEP_RATES[0]), (step_s, STEP_RATES[1])))
    result = Simulator(scenario.dynamic_policy(), scenario.cluster).run(
        _workload(scenario, arrivals, horizon, seed), horizon, drain_s=0.0
    )
    phases = [
        ("before the step", STEP_RATES[0], 0.0, step_s),
        ("first quarter after", STEP_RATES[1], step_s, step_s + horizon / 8),
        ("last quarter after", STEP_RATES[1], horizon - horizon / 8, horizon),
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
