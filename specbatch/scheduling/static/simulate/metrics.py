"""Summary statistics of one simulation run over its measurement window."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np

from specbatch.scheduling.static.simulate.cluster import ClusterConfig
from specbatch.scheduling.static.simulate.records import BatchRecord, RequestOutcome
from specbatch.scheduling.static.simulate.report import percentile_or_nan
from specbatch.scheduling.static.simulate.workload import SimulatedWorkload


@dataclass(frozen=True)
class BinMetrics:
    bin_index: int
    batches: int
    requests: int
    mean_batch_size: float
    mean_max_len: float
    mean_wait_s: float


@dataclass(frozen=True)
class SimulationMetrics:
    """Throughput, latency, SLA, utilisation, batch sizes, per-bin statistics and KV use.

    ``goodput_rps`` counts only completions that met the SLA (per-token latency and deadline).
    """

    window_s: float
    offered_rps: float
    throughput_rps: float
    goodput_rps: float
    token_throughput: float
    latency_mean_s: float
    latency_p50_s: float
    latency_p95_s: float
    latency_p99_s: float
    mean_tpot_s: float
    sla_violation_rate: float
    expired: int
    unfinished: int
    utilisation: float
    mean_batch_size: float
    batch_size_histogram: dict[int, int]
    per_bin: list[BinMetrics]
    peak_kv_demand_tokens: float
    kv_capacity_tokens: int | None
    kv_overflow_batches: int

    def to_dict(self) -> dict:
        data = asdict(self)
        data["batch_size_histogram"] = {str(k): v for k, v in self.batch_size_histogram.items()}
        return data


def summarize(
    workload: SimulatedWorkload,
    outcome: RequestOutcome,
    batches: list[BatchRecord],
    cluster: ClusterConfig,
    num_bins: int,
    *,
    warmup_s: float,
    horizon_s: float,
) -> SimulationMetrics:
    window = horizon_s - warmup_s
    finish = outcome.finish_s
    done = ~np.isnan(finish)
    completed_in_window = done & (finish >= warmup_s) & (finish <= horizon_s)
    arrived = (workload.arrival_s >= warmup_s) & (workload.arrival_s < horizon_s)
    served = arrived & done
    latency = finish[served] - workload.arrival_s[served]
    unfinished = arrived & ~done & ~outcome.expired
    violated = outcome.expired | (arrived & unfinished)
    if workload.deadline_s is not None:
        violated |= done & (finish > workload.deadline_s)
    if cluster.sla_tpot_s is not None:
        violated |= done & (outcome.step_seconds > cluster.sla_tpot_s * (1 + 1e-9))
    in_window = [b for b in batches if warmup_s <= b.start_s < horizon_s]
    busy = sum(max(0.0, min(b.end_s, horizon_s) - max(b.start_s, warmup_s)) for b in batches)
    arrived_count = int(arrived.sum())
    return SimulationMetrics(
        window_s=window,
        offered_rps=arrived_count / window,
        throughput_rps=int(completed_in_window.sum()) / window,
        goodput_rps=int((completed_in_window & ~violated).sum()) / window,
        token_throughput=float(workload.output_tokens[completed_in_window].sum()) / window,
        latency_mean_s=float(np.mean(latency)) if len(latency) else float("nan"),
        latency_p50_s=percentile_or_nan(latency, 50),
        latency_p95_s=percentile_or_nan(latency, 95),
        latency_p99_s=percentile_or_nan(latency, 99),
        mean_tpot_s=float(np.mean(outcome.step_seconds[served])) if served.any() else float("nan"),
        sla_violation_rate=float((violated & arrived).sum()) / arrived_count if arrived_count else 0.0,
        expired=int((arrived & outcome.expired).sum()),
        unfinished=int(unfinished.sum()),
        utilisation=busy / (cluster.num_servers * window),
        mean_batch_size=float(np.mean([b.size for b in in_window])) if in_window else 0.0,
        batch_size_histogram=dict(sorted(Counter(b.size for b in in_window).items())),
        per_bin=_per_bin(workload, outcome, in_window, num_bins, served),
        peak_kv_demand_tokens=max((b.kv_demand_tokens for b in batches), default=0.0),
        kv_capacity_tokens=cluster.kv_capacity_tokens,
        kv_overflow_batches=sum(1 for b in batches if b.passes > 1),
    )


def _per_bin(
    workload: SimulatedWorkload,
    outcome: RequestOutcome,
    batches: list[BatchRecord],
    num_bins: int,
    served: np.ndarray,
) -> list[BinMetrics]:
    rows = []
    for index in range(num_bins):
        mine = [b for b in batches if b.bin_index == index]
        in_bin = served & (outcome.bin_index == index)
        waits = outcome.start_s[in_bin] - workload.arrival_s[in_bin]
        rows.append(
            BinMetrics(
                bin_index=index,
                batches=len(mine),
                requests=int(in_bin.sum()),
                mean_batch_size=float(np.mean([b.size for b in mine])) if mine else 0.0,
                mean_max_len=float(np.mean([b.max_len for b in mine])) if mine else 0.0,
                mean_wait_s=float(np.mean(waits)) if len(waits) else 0.0,
            )
        )
    return rows

