"""The set-ups the static experiments share: the papers' multi-bin setting and a serving scenario.

The serving scenario also measures a run, averages the seeds and tables the result the same
way for every experiment that compares policies on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specbatch.scheduling.static.config import PolicyConfig
from specbatch.scheduling.static.simulate.cluster import ClusterConfig, ServiceTimeModel
from specbatch.scheduling.static.simulate.engine import Simulator
from specbatch.scheduling.static.simulate.report import format_markdown_table
from specbatch.scheduling.static.simulate.workload import (
    GammaLengths,
    NoisyPredictor,
    OnOffArrivals,
    PoissonArrivals,
    SimulatedWorkload,
    StepArrivals,
    draw_workload,
)

PAPER_MIN_LEN, PAPER_MAX_LEN = 1.0, 20.0  # output lengths U(1, 20) of Guldogan et al. (2024)
SERVING_COLUMNS = (
    ("throughput (req/s)", "throughput_rps"),
    ("goodput (req/s)", "goodput_rps"),
    ("tokens/s", "token_throughput"),
    ("p50 (s)", "latency_p50_s"),
    ("p95 (s)", "latency_p95_s"),
    ("p99 (s)", "latency_p99_s"),
    ("SLA viol.", "sla_violation_rate"),
    ("util.", "utilisation"),
    ("mean b", "mean_batch_size"),
    ("peak KV / η", "peak_kv_fraction"),
    ("KV overflow batches / run", "kv_overflow_batches"),
)


def paper_multibin_config(num_bins: int, batch_size: int) -> PolicyConfig:
    """The setting of Guldogan et al.: fixed equally spaced bins over U(1, 20), batches of
    exactly B, no waiting bounds."""
    return PolicyConfig(
        num_bins=num_bins,
        boundaries="fixed",
        min_len=PAPER_MIN_LEN,
        max_len=PAPER_MAX_LEN,
        fixed_batch_size=batch_size,
        dynamic=False,
        flush_window_s=None,
        starvation_bound_s=None,
    )


@dataclass(frozen=True)
class ServingScenario:
    """A Qwen3-like serving set-up in seconds and tokens, shared by the dynamic-batching experiments.

    Two workers, each with 20 000 tokens of KV cache; a decode step of 20 ms at b = 1 growing
    4 % per extra row; 200 ms per batch for prefill and dispatch; a per-token SLA of 40 ms and
    a 120 s end-to-end deadline; right-skewed input (mean 300) and output (mean 200) lengths;
    a length predictor with 30 % log-normal error.
    """

    num_servers: int = 2
    kv_capacity_tokens: int = 20_000
    service: ServiceTimeModel = field(default_factory=lambda: ServiceTimeModel(a0=0.2, a1=0.02, slope=0.04))
    sla_tpot_s: float = 0.040
    eps_d_s: float = 0.003
    deadline_s: float = 120.0
    output_lengths: GammaLengths = field(
        default_factory=lambda: GammaLengths(mean=200, shape=2, low=1, high=1024)
    )
    input_lengths: GammaLengths = field(
        default_factory=lambda: GammaLengths(mean=300, shape=2, low=16, high=2048)
    )
    predictor: NoisyPredictor = field(default_factory=lambda: NoisyPredictor(relative_sigma=0.3))
    flush_window_s: float = 0.5
    starvation_bound_s: float = 30.0
    eps_mem: float = 0.001
    b_max: int = 128

    @property
    def cluster(self) -> ClusterConfig:
        return ClusterConfig(
            num_servers=self.num_servers,
            service=self.service,
            kv_capacity_tokens=self.kv_capacity_tokens,
            sla_tpot_s=self.sla_tpot_s,
        )

    def workload(
        self, arrivals: PoissonArrivals | StepArrivals | OnOffArrivals, horizon_s: float, seed: int
    ) -> SimulatedWorkload:
        """Draw this scenario's lengths, predictions and deadlines under ``arrivals``."""
        return draw_workload(
            arrivals,
            self.output_lengths,
            self.predictor,
            horizon_s,
            seed,
            input_lengths=self.input_lengths,
            relative_deadline_s=self.deadline_s,
        )

    def measure(
        self, policy: PolicyConfig, arrivals: PoissonArrivals | OnOffArrivals, horizon_s: float, seed: int
    ) -> dict[str, float]:
        """One seed's run of ``policy``: the metrics of SERVING_COLUMNS and the offered load over
        the window after a 10 % warm-up, the run drained for one deadline so that late requests
        count."""
        workload = self.workload(arrivals, horizon_s, seed)
        metrics = (
            Simulator(policy, self.cluster)
            .run(workload, horizon_s, warmup_s=0.1 * horizon_s, drain_s=self.deadline_s)
            .metrics
        )
        record = {key: getattr(metrics, key) for _, key in SERVING_COLUMNS if key != "peak_kv_fraction"}
        record["offered_rps"] = metrics.offered_rps
        record["peak_kv_fraction"] = metrics.peak_kv_demand_tokens / self.kv_capacity_tokens
        return record

    def static_policy(self, batch_size: int, num_bins: int = 1) -> PolicyConfig:
        """Fixed B (num_bins = 1: plain FIFO static batching), partial batches after the flush window."""
        return PolicyConfig(
            num_bins=num_bins,
            boundaries="equal_mass",
            max_len=self.output_lengths.high,
            fixed_batch_size=batch_size,
            dynamic=False,
            flush_window_s=self.flush_window_s,
            starvation_bound_s=self.starvation_bound_s,
        )

    def dynamic_policy(self, num_bins: int = 1, *, use_sla: bool = True) -> PolicyConfig:
        """min(b_mem, b_SLA); the controller aims at SLA − ε_D so its band tops out at the SLA."""
        return PolicyConfig(
            num_bins=num_bins,
            boundaries="equal_mass",
            max_len=self.output_lengths.high,
            dynamic=True,
            b_max=self.b_max,
            eps_mem=self.eps_mem,
            d_sla_s=self.sla_tpot_s - self.eps_d_s if use_sla else None,
            eps_d=self.eps_d_s,
            flush_window_s=self.flush_window_s,
            starvation_bound_s=self.starvation_bound_s,
        )


def over_seeds(records: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The runs of several seeds as one row: the mean of every metric, but the highest peak KV."""
    row = {key: sum(r[key] for r in records) / len(records) for key in records[0]}
    row["peak_kv_fraction"] = max(r["peak_kv_fraction"] for r in records)
    return {"seeds": len(records), **row}


def serving_table(rows: Sequence[Mapping[str, Any]], leading: Sequence[tuple[str, str]]) -> str:
    """Rows of ``over_seeds`` as markdown: the ``leading`` (header, key) columns, then SERVING_COLUMNS."""
    columns = [*leading, *SERVING_COLUMNS]
    return format_markdown_table(
        [header for header, _ in columns],
        [[_serving_cell(key, row[key]) for _, key in columns] for row in rows],
    )


def _serving_cell(key: str, value: Any) -> Any:
    return f"{100 * value:.1f} %" if key == "sla_violation_rate" else value
