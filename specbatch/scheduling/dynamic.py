"""b_SLA and running statistics: the measured-feedback half of dynamic batching (Pang et al. 2025).

The admission policy keeps one SlaBatchController per instance and RunningStats of its
length predictions and their errors (for its b_mem margin); the static batch-level policy
(``specbatch.scheduling.static``) keeps one controller per worker and RunningStats of the
KV tokens per request.

Algorithm 2 (SLA): a binary search over [b_low, b_high] steered by the moving average D̄ of
measured seconds per decoded token. D̄ above D_SLA + ε_D caps b_high at the size that was too
slow and widens b_low downwards by α; D̄ below D_SLA − ε_D lifts b_low to the size that was
fast enough and widens b_high upwards by α when the top of the interval was the size tested;
inside the band the interval shrinks to ±δ around the tested size. b_SLA is the midpoint.
The interval moves on the batch size actually run, so a lightly loaded server (small batches,
low latency) does not wind b_SLA up to sizes it never measured. The controller also keeps its
floor: the fastest pace measured to be reachable (at the smallest batch, or any faster window),
which tells its owner whether D_SLA is within reach at all (see ``retarget``).
"""

from __future__ import annotations

from collections import deque


class RunningStats:
    """Running mean and variance (Welford): numerically stable and O(1) per sample."""

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self._m2 = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self._m2 += delta * (value - self.mean)

    @property
    def variance(self) -> float:
        """Sample variance; 0 until two samples are seen."""
        return self._m2 / (self.count - 1) if self.count > 1 else 0.0


class SlaBatchController:
    """b_SLA: the feedback search of Algorithm 2 for one worker."""

    def __init__(
        self,
        d_sla_s: float,
        eps_d_s: float,
        alpha: int,
        delta: int,
        b_min: int,
        b_max: int,
        window: int,
    ) -> None:
        self._target = d_sla_s
        self._tolerance = eps_d_s
        self._alpha = alpha
        self._delta = delta
        self._b_min = b_min
        self._b_max = b_max
        self._latencies: deque[float] = deque(maxlen=window)
        self.b_low = b_min
        self.b_high = b_max
        self.b_sla = self._midpoint()
        self._floor_s: float | None = None

    def retarget(self, d_sla_s: float, eps_d_s: float) -> None:
        """Hold the worker to a new pace from the next measurement on (the interval found so
        far stays: it moves towards the new pace as measurements arrive)."""
        self._target = d_sla_s
        self._tolerance = eps_d_s

    @property
    def floor_s(self) -> float | None:
        """The fastest pace measured to be reachable: seconds per token at the smallest
        batch (smoothed), lowered by any full window of larger batches that ran faster;
        None before the search has run at the smallest batch."""
        return self._floor_s

    @property
    def moving_latency_s(self) -> float | None:
        """D̄: mean of the last ``window`` measurements, None before the first."""
        return sum(self._latencies) / len(self._latencies) if self._latencies else None

    def update(self, seconds_per_token: float, batch_size: int) -> int:
        """Fold in one measurement taken at ``batch_size``; return the new b_SLA."""
        self._latencies.append(seconds_per_token)
        latency = self.moving_latency_s
        tested = min(max(batch_size, self._b_min), self._b_max)
        self._learn_floor(seconds_per_token, latency, tested)
        if latency > self._target + self._tolerance:
            self.b_high = max(self._b_min, min(self.b_high, tested - 1))
            self.b_low = max(self._b_min, min(self.b_low, self.b_high) - self._alpha)
        elif latency < self._target - self._tolerance:
            self.b_low = min(max(self.b_low, tested), self._b_max)
            self.b_high = min(self._b_max, max(self.b_high, tested + self._alpha))
        else:
            self.b_low = max(self._b_min, tested - self._delta)
            self.b_high = min(self._b_max, tested + self._delta)
        self.b_sla = self._midpoint()
        return self.b_sla

    def _learn_floor(self, seconds_per_token: float, latency: float, tested: int) -> None:
        """Smooth the smallest batch's measurements into the floor; a full window of larger
        batches that ran faster shows the floor was a slow spell, and lowers it."""
        if tested == self._b_min:
            previous = self._floor_s
            self._floor_s = (
                seconds_per_token if previous is None else 0.75 * previous + 0.25 * seconds_per_token
            )
        elif self._floor_s is not None and len(self._latencies) == self._latencies.maxlen:
            self._floor_s = min(self._floor_s, latency)

    def _midpoint(self) -> int:
        return (self.b_low + self.b_high + 1) // 2
