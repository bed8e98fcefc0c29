"""The setting of Figure 6 of Guldogan et al. (2024): B = 8, 8 servers, Poisson load swept to saturation.

For each k the arrival rate is swept past capacity and the largest measured throughput is the
maximum throughput; the gain over k = 1 is compared with Theorem 4.2 (whose B/(m + …) per
server scales by the server count). The sweep is repeated with two imperfect predictors to
show how much of the gain survives: 30 % log-normal length error, and a bin classifier that is
right 80 % of the time and otherwise off by one bin.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tqdm import tqdm

from specbatch.scheduling.static.simulate.cluster import ClusterConfig
from specbatch.scheduling.static.simulate.engine import Simulator
from specbatch.scheduling.static.simulate.experiments.scenarios import (
    PAPER_MAX_LEN,
    PAPER_MIN_LEN,
    paper_multibin_config,
)
from specbatch.scheduling.static.simulate.plots import plot_figure6
from specbatch.scheduling.static.simulate.report import ExperimentOutput, format_markdown_table, write_json
from specbatch.scheduling.static.simulate.theory import (
    max_multibin_throughput,
    theoretical_multibin_throughput,
)
from specbatch.scheduling.static.simulate.workload import (
    BinConfusionPredictor,
    NoisyPredictor,
    OraclePredictor,
    PoissonArrivals,
    UniformLengths,
    draw_workload,
)

logger = logging.getLogger(__name__)

FIGURE6_BATCH_SIZE = 8
FIGURE6_BIN_COUNTS = (1, 2, 4, 8)
SERVERS = 8
PAPER_GAINS = {1: 1.0, 2: 1.21, 4: 1.41, 8: 1.55}
PREDICTORS = ("oracle", "noisy σ=0.3", "bin-confusion 80 %")


def _predictor(name: str, k: int) -> OraclePredictor | NoisyPredictor | BinConfusionPredictor:
    if name == "oracle":
        return OraclePredictor()
    if name.startswith("noisy"):
        return NoisyPredictor(relative_sigma=0.3)
    return BinConfusionPredictor.adjacent(k, accuracy=0.8, low=PAPER_MIN_LEN, high=PAPER_MAX_LEN)


def run(out_dir: Path, *, quick: bool, seed: int) -> ExperimentOutput:
    horizon = 1_500.0 if quick else 5_000.0
    fractions = (0.4, 0.7, 1.0, 1.3) if quick else (0.3, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95, 1.1, 1.3)
    c_total = SERVERS * max_multibin_throughput(FIGURE6_BATCH_SIZE, PAPER_MIN_LEN, PAPER_MAX_LEN)
    cluster = ClusterConfig(num_servers=SERVERS)
    jobs = [(p, k, f) for p in PREDICTORS for k in FIGURE6_BIN_COUNTS for f in fractions]
    points: list[dict] = []
    for predictor, k, fraction in tqdm(jobs, desc="figure6", unit="run"):
        workload = draw_workload(
            PoissonArrivals(fraction * c_total),
            UniformLengths(PAPER_MIN_LEN, PAPER_MAX_LEN),
            _predictor(predictor, k),
            horizon,
            seed,
        )
        config = paper_multibin_config(k, FIGURE6_BATCH_SIZE)
        metrics = Simulator(config, cluster).run(workload, horizon, warmup_s=0.1 * horizon).metrics
        points.append(
            {
                "predictor": predictor,
                "k": k,
                "arrival_rate": fraction * c_total,
                "throughput": metrics.throughput_rps,
                "mean_latency": metrics.latency_mean_s,
                "latency_p95": metrics.latency_p95_s,
                "utilisation": metrics.utilisation,
            }
        )
    summary = _summarize(points)
    logger.info("figure6: %d runs", len(points))
    json_path = write_json(out_dir / "figure6.json", {"points": points, "summary": summary})
    curves = {
        p: {
            k: [(q["throughput"], q["mean_latency"]) for q in points if q["predictor"] == p and q["k"] == k]
            for k in FIGURE6_BIN_COUNTS
        }
        for p in PREDICTORS
    }
    figure = plot_figure6(curves, out_dir / "sched_figure6.png")
    table = format_markdown_table(
        [
            "k",
            "theory gain",
            "paper gain",
            *[f"max thr ({p})" for p in PREDICTORS],
            *[f"gain ({p})" for p in PREDICTORS],
        ],
        [
            [
                s["k"],
                f"×{s['theoretical_gain']:.2f}",
                f"×{PAPER_GAINS[s['k']]:.2f}",
                *[s["max_throughput"][p] for p in PREDICTORS],
                *[f"×{s['gain'][p]:.2f}" for p in PREDICTORS],
            ]
            for s in summary
        ],
    )
    return ExperimentOutput("figure6", [table], json_path, [figure])


def _summarize(points: list[dict]) -> list[dict]:
    best = {(q["predictor"], q["k"]): 0.0 for q in points}
    for q in points:
        best[q["predictor"], q["k"]] = max(best[q["predictor"], q["k"]], q["throughput"])
    theory = {
        k: theoretical_multibin_throughput(FIGURE6_BATCH_SIZE, k, PAPER_MIN_LEN, PAPER_MAX_LEN)
        for k in (1, *FIGURE6_BIN_COUNTS)
    }
    return [
        {
            "k": k,
            "theoretical_gain": theory[k] / theory[1],
            "theoretical_max_throughput": SERVERS * theory[k],
            "max_throughput": {p: best[p, k] for p in PREDICTORS},
            "gain": {p: best[p, k] / best[p, 1] for p in PREDICTORS},
        }
        for k in FIGURE6_BIN_COUNTS
    ]
