"""Theorem 4.2 of Guldogan et al. (2024): multi-bin throughput on one saturated server.

B = 128, output lengths U(1, 20) (continuous, as the theorem assumes), service time equal to
the longest member of the batch, k equal-width bins, paper-faithful fixed-B batching. The
server is saturated by Poisson arrivals at 1.3 · c_max, above the capacity of every k.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tqdm import tqdm

from specbatch.scheduling.static.simulate.cluster import ClusterConfig, ServiceTimeModel
from specbatch.scheduling.static.simulate.engine import Simulator
from specbatch.scheduling.static.simulate.experiments.scenarios import (
    PAPER_MAX_LEN,
    PAPER_MIN_LEN,
    paper_multibin_config,
)
from specbatch.scheduling.static.simulate.plots import plot_theorem42
from specbatch.scheduling.static.simulate.report import ExperimentOutput, format_markdown_table, write_json
from specbatch.scheduling.static.simulate.theory import (
    max_multibin_throughput,
    theoretical_multibin_throughput,
)
from specbatch.scheduling.static.simulate.workload import (
    OraclePredictor,
    PoissonArrivals,
    UniformLengths,
    draw_workload,
)

logger = logging.getLogger(__name__)

THEOREM42_BATCH_SIZE = 128
THEOREM42_BIN_COUNTS = (1, 2, 4, 8, 16)
OVERLOAD = 1.3


def theorem42_rows(
    horizon: float, seed: int, bin_counts: tuple[int, ...] = THEOREM42_BIN_COUNTS
) -> list[dict]:
    """Simulated and theoretical throughput for each k (one row per k)."""
    c_max = max_multibin_throughput(THEOREM42_BATCH_SIZE, PAPER_MIN_LEN, PAPER_MAX_LEN)
    cluster = ClusterConfig(num_servers=1, service=ServiceTimeModel(a0=0.0, a1=1.0, slope=0.0))
    rows = []
    baseline_sim = baseline_theory = None
    for k in tqdm(bin_counts, desc="theorem42", unit="k"):
        workload = draw_workload(
            PoissonArrivals(OVERLOAD * c_max),
            UniformLengths(PAPER_MIN_LEN, PAPER_MAX_LEN),
            OraclePredictor(),
            horizon,
            seed + k,
        )
        config = paper_multibin_config(k, THEOREM42_BATCH_SIZE)
        metrics = Simulator(config, cluster).run(workload, horizon, warmup_s=0.1 * horizon).metrics
        theory = theoretical_multibin_throughput(THEOREM42_BATCH_SIZE, k, PAPER_MIN_LEN, PAPER_MAX_LEN)
        if baseline_sim is None:
            baseline_sim, baseline_theory = metrics.throughput_rps, theory
        rows.append(
            {
                "k": k,
                "simulated_throughput": metrics.throughput_rps,
                "theoretical_throughput": theory,
                "relative_error": metrics.throughput_rps / theory - 1.0,
                "simulated_gain": metrics.throughput_rps / baseline_sim,
                "theoretical_gain": theory / baseline_theory,
                "c_max": c_max,
                "batch_size": THEOREM42_BATCH_SIZE,
                "utilisation": metrics.utilisation,
                "requests": len(workload),
            }
        )
        logger.info("theorem42 k=%d simulated %.3f theory %.3f", k, metrics.throughput_rps, theory)
    return rows


def run(out_dir: Path, *, quick: bool, seed: int) -> ExperimentOutput:
    horizon = 4_000.0 if quick else 30_000.0
    rows = theorem42_rows(horizon, seed)
    json_path = write_json(out_dir / "theorem42.json", rows)
    figure = plot_theorem42(rows, rows[0]["c_max"], out_dir / "sched_theorem42.png")
    table = format_markdown_table(
        ["k", "simulated", "Theorem 4.2", "error", "gain (sim)", "gain (theory)"],
        [
            [
                r["k"],
                r["simulated_throughput"],
                r["theoretical_throughput"],
                f"{100 * r['relative_error']:+.2f} %",
                f"×{r['simulated_gain']:.2f}",
                f"×{r['theoretical_gain']:.2f}",
            ]
            for r in rows
        ],
    )
    table += f"\n\nc_max = B/m = {rows[0]['c_max']:.2f} requests per time unit (k → ∞)."
    return ExperimentOutput("theorem42", [table], json_path, [figure])
