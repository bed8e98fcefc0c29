"""Service-time model of a batch: a0 + a1 · max_len · h(b), with h(b) = 1 + slope · (b − 1).

Static batching runs a batch until its longest member finishes, so a batch costs its longest
output times the per-token step time a1·h(b), plus a fixed a0 (prefill, dispatch). h grows
with b because a decode step reads more KV cache and does more compute per extra row. The
coefficients come from configuration or from a least-squares fit to measured step times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specbatch.scheduling.errors import SimulationConfigError


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

    def batch_seconds(self, batch_size: int, max_len: float) -> float:
        return self.a0 + self.step_seconds(batch_size) * max_len


def _model(a0: float, a1: float, a1_slope: float) -> ServiceTimeModel:
    if a1 <= 0:
        raise SimulationConfigError(f"the fit gives a non-positive per-step time a1={a1:.3g}; check the data")
    return ServiceTimeModel(a0=max(float(a0), 0.0), a1=float(a1), slope=max(float(a1_slope) / float(a1), 0.0))
