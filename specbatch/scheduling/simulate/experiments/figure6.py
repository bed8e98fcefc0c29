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

from specbatch.scheduling.simulate.engine import ClusterConfig, Simulator
from specbatch.scheduling.simulate.experiments.common import (
    ExperimentOutput,
    markdown_table,
    paper_multibin_config,
    write_json,
)
from specbatch.scheduling.simulate.plots import plot_figure6
from specbatch.scheduling.simulate.theory import max_multibin_throughput, theoretical_multibin_throughput
from specbatch.scheduling.simulate.workload import (
    BinConfusionPredictor,
    NoisyPredictor,
    OraclePredictor,
    PoissonArrivals,
    UniformLengths,
    make_workload,
)

logger = logging.getLogger(__name__)

BATCH_SIZE = 8
SERVERS = 8
LOW, HIGH = 1.0, 20.0
BIN_COUNTS = (1, 2, 4, 8)
PAPER_GAINS = {1: 1.0, 2: 1.21, 4: 1.41, 8: 1.55}
PREDICTORS = ("oracle", "noisy σ=0.3", "bin-confusion 80 %")


def _predictor(name: str, k: int) -> OraclePredictor | NoisyPredictor | BinConfusionPredictor:
    if name == "oracle":
        return OraclePredictor()
    if name.startswith("noisy"):
        return NoisyPredictor(relative_sigma=0.3)
    return BinConfusionPredictor.adjacent(k, accuracy=0.8, low=LOW, high=HIGH)


def run(out_dir: Path, *, quick: bool, seed: int) -> ExperimentOutput:
    horizon = 1_500.0 if quick else 5_000.0
    fractions = (0.4, 0.7, 1.0, 1.3) if quick else (0.3, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95, 1.1, 1.3)
    c_total = SERVERS * max_multibin_throughput(BATCH_SIZE, LOW, HIGH)
    cluster = ClusterConfig(num_servers=SERVERS)
    jobs = [(p, k, f) for p in PREDICTORS for k in BIN_COUNTS for f in fractions]
    points: list[dict] = []
    for predictor, k, fraction in tqdm(jobs, desc="figure6", unit="run"):
        workload = make_workload(
            PoissonArrivals(fraction * c_total),
            UniformLengths(LOW, HIGH),
            _predictor(predictor, k),
            horizon,
            seed,
        )
        config = paper_multibin_config(k, LOW, HIGH, BATCH_SIZE)
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
            for k in BIN_COUNTS
        }
        for p in PREDICTORS
    }
    figure = plot_figure6(curves, out_dir / "sched_figure6.png")
    table = markdown_table(
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
    theory_1 = theoretical_multibin_throughput(BATCH_SIZE, 1, LOW, HIGH)
    return [
        {
            "k": k,
            "theoretical_gain": theoretical_multibin_throughput(BATCH_SIZE, k, LOW, HIGH) / theory_1,
            "theoretical_max_throughput": SERVERS * theoretical_multibin_throughput(BATCH_SIZE, k, LOW, HIGH),
            "max_throughput": {p: best[p, k] for p in PREDICTORS},
            "gain": {p: best[p, k] / best[p, 1] for p in PREDICTORS},
        }
        for k in BIN_COUNTS
    ]
