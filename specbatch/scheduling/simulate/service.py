"""Service-time model of a batch: a0 + a1 · max_len · h(b), with h(b) = 1 + slope · (b − 1).

Static batching runs a batch until its longest member finishes, so a batch costs its longest
output times the per-token step time a1·h(b), plus a fixed a0 (prefill, dispatch). h grows
with b because a decode step reads more KV cache and does more compute per extra row. The
coefficients come from configuration or from a least-squares fit to measured step times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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


def fit_service_model(
    batch_sizes: Sequence[int], max_lens: Sequence[float], seconds: Sequence[float]
) -> ServiceTimeModel:
    """Least-squares fit of whole-batch times: t = a0 + a1·L + (a1·slope)·L·(b − 1)."""
    b, length, t = _as_arrays(batch_sizes, max_lens, seconds)
    design = np.column_stack([np.ones_like(length), length, length * (b - 1)])
    (a0, a1, a1_slope), *_ = np.linalg.lstsq(design, t, rcond=None)
    return _model(a0, a1, a1_slope)


def fit_step_times(
    batch_sizes: Sequence[int], step_seconds: Sequence[float], a0: float = 0.0
) -> ServiceTimeModel:
    """Fit a1 and slope from per-step decode times measured at several batch sizes.

    Model: s = a1 + (a1·slope)·(b − 1); ``a0`` (prefill, dispatch) is measured separately.
    """
    b, _, s = _as_arrays(batch_sizes, np.ones(len(step_seconds)), step_seconds)
    design = np.column_stack([np.ones_like(b), b - 1])
    (a1, a1_slope), *_ = np.linalg.lstsq(design, s, rcond=None)
    return _model(a0, a1, a1_slope)


def _as_arrays(*columns: Sequence[float]) -> tuple[np.ndarray, ...]:
    arrays = tuple(np.asarray(c, dtype=float) for c in columns)
    if len({len(a) for a in arrays}) != 1:
        raise SimulationConfigError("measurement columns must have the same length")
    if len(arrays[0]) < 2:
        raise SimulationConfigError("a fit needs at least two measurements")
    if any(not np.all(np.isfinite(a)) for a in arrays):
        raise SimulationConfigError("measurements must be finite numbers")
    return arrays


def _model(a0: float, a1: float, a1_slope: float) -> ServiceTimeModel:
    if a1 <= 0:
        raise SimulationConfigError(f"the fit gives a non-positive per-step time a1={a1:.3g}; check the data")
    return ServiceTimeModel(a0=max(float(a0), 0.0), a1=float(a1), slope=max(float(a1_slope) / float(a1), 0.0))
