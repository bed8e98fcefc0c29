"""The simulated servers: how many, how much KV each holds, and how long a batch takes on one.

A batch takes a0 + a1 · max_len · h(b), with h(b) = 1 + slope · (b − 1). Static batching
runs a batch until its longest member finishes, so a batch costs its longest output times
the per-token step time a1·h(b), plus a fixed a0 (prefill, dispatch). h grows with b because
a decode step reads more KV cache and does more compute per extra row. The coefficients are
configured per experiment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specbatch.scheduling.static.errors import SimulationConfigError


@dataclass(frozen=True)
class ServiceTimeModel:
    """``a0`` s per batch, ``a1`` s per decode step at b = 1, ``slope``: step growth per extra row."""

    a0: float = 0.0
    a1: float = 1.0
    slope: float = 0.0

    def __post_init__(self) -> None:
        for name in ("a0", "a1", "slope"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise SimulationConfigError(
                    f"ServiceTimeModel.{name} must be a finite number >= 0, got {value!r}"
                )
        if self.a1 == 0:
            raise SimulationConfigError("ServiceTimeModel.a1 must be > 0: a decode step cannot be free")

    def step_seconds(self, batch_size: int) -> float:
        """a1 · h(b): time of one decode step for a batch of ``batch_size`` rows."""
        return self.a1 * (1.0 + self.slope * (batch_size - 1))


@dataclass(frozen=True)
class ClusterConfig:
    """The simulated servers: how many, how fast, how much KV, and the per-token SLA to account."""

    num_servers: int = 1
    service: ServiceTimeModel = field(default_factory=ServiceTimeModel)
    kv_capacity_tokens: int | None = None
    sla_tpot_s: float | None = None

    def __post_init__(self) -> None:
        if (
            isinstance(self.num_servers, bool)
            or not isinstance(self.num_servers, int)
            or self.num_servers < 1
        ):
            raise SimulationConfigError(f"num_servers must be an int >= 1, got {self.num_servers!r}")
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < 1:
            raise SimulationConfigError(f"kv_capacity_tokens must be >= 1, got {self.kv_capacity_tokens}")
        if self.sla_tpot_s is not None and not self.sla_tpot_s > 0:
            raise SimulationConfigError(f"sla_tpot_s must be > 0, got {self.sla_tpot_s}")
