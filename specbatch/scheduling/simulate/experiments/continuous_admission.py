"""Admission over continuous-batching instances: least slack vs first come, by offered load.

The step-level simulator (`specbatch.scheduling.simulate.continuous`) runs the server's own `AdmissionPolicy`
over two instances: the same Poisson arrivals (gamma output lengths, predictions off
by ±30 %) at 0.5–1.5× the instances' capacity, once with the scheduler's least-slack
admission (bins, min(b_mem, b_SLA), capacity-sized queue) and once first-come
first-served with no bound (what vLLM does). Goodput counts requests whose first token
came within the TTFT SLA and whose tokens came at most at the per-token SLA.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from tqdm import tqdm

from specbatch.scheduling.admission import AdmissionConfig, AdmissionPolicy
from specbatch.scheduling.simulate.continuous import (
    ContinuousSimulator,
    SimInstance,
    SimRequest,
    StepCosts,
    goodput,
)
from specbatch.scheduling.static.simulate.report import (
    ExperimentOutput,
    format_markdown_table,
    percentile_or_nan,
    write_json,
)

logger = logging.getLogger(__name__)

TTFT_SLA_S, TPOT_SLA_S = 1.0, 0.1
COSTS = StepCosts(base_s=0.02, per_row_s=0.004, per_prefill_token_s=0.00005)
INSTANCES = (SimInstance(kv_tokens=8192, max_rows=32), SimInstance(kv_tokens=8192, max_rows=32))
CAPACITY_RPS = 5.5  # about the highest rate first-come admission serves within the SLA
LOAD_FACTORS = (0.5, 0.8, 1.0, 1.2, 1.5)  # offered rate as a multiple of CAPACITY_RPS


def poisson_requests(rate: float, seconds: float, seed: int) -> list[SimRequest]:
    """Poisson arrivals at ``rate`` with gamma output lengths, each predicted within ±30 %."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, int(rate * seconds * 1.2)))
    times = times[times < seconds]
    lengths = np.maximum(4, rng.gamma(2.0, 32.0, len(times)).astype(int))
    return [
        SimRequest(i, float(t), int(rng.integers(16, 128)), int(n), float(n) * float(rng.uniform(0.7, 1.3)))
        for i, (t, n) in enumerate(zip(times, lengths, strict=True))
    ]


def admission_policy(order: str) -> AdmissionPolicy:
    """The scheduler's policy in ``order``; first come, first served also runs without a queue
    bound, memory margin, b_SLA or early shedding, as vLLM does."""
    smart = order == "least_slack"
    return AdmissionPolicy(
        AdmissionConfig(
            order=order,
            queue_limit=256 if smart else 1_000_000,
            ttft_sla_s=TTFT_SLA_S,
            tpot_sla_s=TPOT_SLA_S,
            max_rows=32,
            memory_aware=smart,
            sla_aware=smart,
            shed_deadlines=smart,
        )
    )


def run(out_dir: Path, *, quick: bool = False, seed: int = 0) -> ExperimentOutput:
    seconds = 60.0 if quick else 300.0
    rows = []
    for load in tqdm(LOAD_FACTORS, desc="continuous_admission", unit="load"):
        requests = poisson_requests(load * CAPACITY_RPS, seconds, seed)
        for order in ("least_slack", "fcfs"):
            simulator = ContinuousSimulator(lambda order=order: admission_policy(order), INSTANCES, COSTS)
            outcomes = simulator.run(requests)
            served = [o for o in outcomes if o.status == "served"]
            ttfts = [o.ttft_s for o in served]
            rows.append(
                {
                    "load": load,
                    "policy": order,
                    "offered": len(requests),
                    "served": len(served),
                    "rejected": sum(o.status == "rejected" for o in outcomes),
                    "goodput_rps": goodput(outcomes, TTFT_SLA_S, TPOT_SLA_S, seconds),
                    "ttft_p95_s": percentile_or_nan(ttfts, 95),
                }
            )
    json_path = write_json(out_dir / "continuous_admission.json", rows)
    by_load = {(r["load"], r["policy"]): r for r in rows}
    table = format_markdown_table(
        ["load", "policy", "served / offered", "rejected", "goodput (req/s)", "vs fcfs", "TTFT p95 (s)"],
        [
            [
                f"{r['load']:.1f}×",
                r["policy"],
                f"{r['served']}/{r['offered']}",
                r["rejected"],
                r["goodput_rps"],
                f"×{r['goodput_rps'] / max(by_load[(r['load'], 'fcfs')]['goodput_rps'], 1e-9):.2f}",
                r["ttft_p95_s"],
            ]
            for r in rows
        ],
    )
    logger.info("continuous_admission: %d runs", len(rows))
    return ExperimentOutput("continuous_admission", [table], json_path, [])
