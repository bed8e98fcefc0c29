"""What one simulation run records: a row per executed batch, an array slot per request.

The engine writes these and the metrics read them, so they live apart from both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class BatchRecord:
    """One executed batch, for metrics and plots."""

    worker: int
    start_s: float
    end_s: float
    size: int
    bin_index: int
    max_len: float
    kv_demand_tokens: float
    passes: int
    step_seconds: float
    target_size: int
    b_mem: int | None
    b_sla: int | None


@dataclass
class RequestOutcome:
    """Per-request arrays (index = request number); NaN where the request never ran."""

    start_s: np.ndarray
    finish_s: np.ndarray
    step_seconds: np.ndarray
    bin_index: np.ndarray
    expired: np.ndarray
