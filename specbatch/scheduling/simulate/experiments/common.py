"""Shared pieces of the experiments: output records, markdown tables, the serving scenario."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specbatch.scheduling.config import PolicyConfig
from specbatch.scheduling.simulate.engine import ClusterConfig
from specbatch.scheduling.simulate.service import ServiceTimeModel
from specbatch.scheduling.simulate.workload import GammaLengths, NoisyPredictor


@dataclass
class ExperimentOutput:
    """What an experiment produced: markdown tables to print, the JSON and PNG files it wrote."""

    name: str
    tables: list[str]
    json_path: Path
    figures: list[Path] = field(default_factory=list)


def paper_multibin_config(num_bins: int, low: float, high: float, batch_size: int) -> PolicyConfig:
    """The setting of Guldogan et al.: fixed equally spaced bins, batches of exactly B, no waiting bounds."""
    return PolicyConfig(
        num_bins=num_bins,
        boundaries="fixed",
        min_len=low,
        max_len=high,
        fixed_batch_size=batch_size,
        dynamic=False,
        flush_window_s=None,
        starvation_bound_s=None,
    )


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")
    return path


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def _jsonable(value: object) -> object:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


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


def mean_of(rows: Sequence[Mapping[str, float]], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)
