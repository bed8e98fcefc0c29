"""Synthetic workloads: arrival processes, output-length distributions and length predictors.

Every generator takes a numpy ``Generator`` so a seed fixes the whole workload, and the same
workload (same arrays) can be replayed under each policy being compared.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from specbatch.scheduling.bins import equally_spaced_cuts
from specbatch.scheduling.static.errors import SimulationConfigError

# ------------------------------------------------------------------ arrivals


@dataclass(frozen=True)
class PoissonArrivals:
    """Homogeneous Poisson arrivals at ``rate_per_s``."""

    rate_per_s: float

    def __post_init__(self) -> None:
        _positive("rate_per_s", self.rate_per_s)

    def times(self, rng: np.random.Generator, horizon_s: float) -> np.ndarray:
        return _poisson_segment(rng, self.rate_per_s, 0.0, horizon_s)


@dataclass(frozen=True)
class StepArrivals:
    """Piecewise-constant Poisson rate: ``segments`` is ((start_s, rate_per_s), ...), ascending starts.

    Used for the load-step experiment: the dynamic batch size must follow a jump in load.
    """

    segments: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if not self.segments or self.segments[0][0] != 0:
            raise SimulationConfigError("StepArrivals needs segments starting at time 0")
        starts = [s for s, _ in self.segments]
        if any(b <= a for a, b in itertools.pairwise(starts)):
            raise SimulationConfigError(f"segment starts must be strictly ascending, got {starts}")
        for _, rate in self.segments:
            _non_negative("rate_per_s", rate)

    def times(self, rng: np.random.Generator, horizon_s: float) -> np.ndarray:
        ends = [s for s, _ in self.segments[1:]] + [horizon_s]
        parts = [
            _poisson_segment(rng, rate, start, min(end, horizon_s))
            for (start, rate), end in zip(self.segments, ends, strict=True)
            if start < horizon_s
        ]
        return np.concatenate(parts) if parts else np.empty(0)


@dataclass(frozen=True)
class OnOffArrivals:
    """BurstGPT-like bursty traffic: ON periods at ``rate_on`` alternate with OFF periods at ``rate_off``.

    Period lengths are exponential with the given means, so bursts come at random times with
    random durations, the pattern BurstGPT reports for conversational LLM traffic.
    """

    rate_on: float
    rate_off: float
    mean_on_s: float
    mean_off_s: float

    def __post_init__(self) -> None:
        _positive("rate_on", self.rate_on)
        _non_negative("rate_off", self.rate_off)
        _positive("mean_on_s", self.mean_on_s)
        _positive("mean_off_s", self.mean_off_s)

    @property
    def mean_rate_per_s(self) -> float:
        total = self.mean_on_s + self.mean_off_s
        return (self.rate_on * self.mean_on_s + self.rate_off * self.mean_off_s) / total

    def times(self, rng: np.random.Generator, horizon_s: float) -> np.ndarray:
        parts = []
        start, on = 0.0, True
        while start < horizon_s:
            length = rng.exponential(self.mean_on_s if on else self.mean_off_s)
            end = min(start + length, horizon_s)
            parts.append(_poisson_segment(rng, self.rate_on if on else self.rate_off, start, end))
            start, on = end, not on
        return np.concatenate(parts) if parts else np.empty(0)


def _poisson_segment(rng: np.random.Generator, rate: float, start: float, end: float) -> np.ndarray:
    """Poisson points on [start, end): the count is Poisson, the points uniform and sorted."""
    if rate <= 0 or end <= start:
        return np.empty(0)
    count = rng.poisson(rate * (end - start))
    return np.sort(rng.uniform(start, end, size=count))


# ------------------------------------------------------------- length laws


@dataclass(frozen=True)
class UniformLengths:
    """U(low, high); continuous by default, which is what Theorem 4.2 is stated for."""

    low: float
    high: float
    integer: bool = False

    def __post_init__(self) -> None:
        _non_negative("low", self.low)
        if not self.high > self.low:
            raise SimulationConfigError(f"UniformLengths needs high > low, got [{self.low}, {self.high}]")

    @property
    def support(self) -> tuple[float, float]:
        return self.low, self.high

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        if self.integer:
            return rng.integers(int(self.low), int(self.high) + 1, size=count).astype(float)
        return rng.uniform(self.low, self.high, size=count)


@dataclass(frozen=True)
class GammaLengths:
    """Gamma with the given mean and shape, rounded to whole tokens and clipped to [low, high].

    LLM output lengths are right-skewed; a gamma with shape ~2 is a common stand-in.
    """

    mean: float
    shape: float
    low: float = 1.0
    high: float = 4096.0

    def __post_init__(self) -> None:
        _positive("mean", self.mean)
        _positive("shape", self.shape)
        if not self.high > self.low >= 0:
            raise SimulationConfigError(f"GammaLengths needs 0 <= low < high, got [{self.low}, {self.high}]")

    @property
    def support(self) -> tuple[float, float]:
        return self.low, self.high

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        values = rng.gamma(self.shape, self.mean / self.shape, size=count)
        return np.clip(np.round(values), self.low, self.high)


@dataclass(frozen=True)
class EmpiricalLengths:
    """Resampling (with replacement) of lengths measured on a real workload."""

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise SimulationConfigError("EmpiricalLengths needs at least one observed length")
        if any(not math.isfinite(v) or v < 0 for v in self.values):
            raise SimulationConfigError("EmpiricalLengths values must be finite and >= 0")
        object.__setattr__(self, "values", tuple(float(v) for v in self.values))

    @property
    def support(self) -> tuple[float, float]:
        return min(self.values), max(self.values)

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return rng.choice(np.asarray(self.values), size=count, replace=True)


# --------------------------------------------------------------- predictors


@dataclass(frozen=True)
class OraclePredictor:
    """Predicts the true length: the upper bound on what binning can gain."""

    def predict(self, rng: np.random.Generator, true_lengths: np.ndarray) -> np.ndarray:
        return true_lengths.copy()


@dataclass(frozen=True)
class NoisyPredictor:
    """Multiplicative log-normal error: predicted = true · exp(N(0, relative_sigma²)).

    Length predictors err in proportion to the length, so the error is relative, not absolute.
    """

    relative_sigma: float

    def __post_init__(self) -> None:
        _non_negative("relative_sigma", self.relative_sigma)

    def predict(self, rng: np.random.Generator, true_lengths: np.ndarray) -> np.ndarray:
        return true_lengths * np.exp(rng.normal(0.0, self.relative_sigma, size=true_lengths.shape))


@dataclass(frozen=True)
class BinConfusionPredictor:
    """Predicts a bin, not a length: true bin i is reported as bin j with probability confusion[i][j].

    The predicted length is a uniform point of bin j (over ``low``..``high`` split equally in
    ``len(confusion)`` bins), so a policy with the same fixed boundaries sees exactly bin j.
    """

    confusion: tuple[tuple[float, ...], ...]
    low: float
    high: float

    def __post_init__(self) -> None:
        k = len(self.confusion)
        if k == 0 or any(len(row) != k for row in self.confusion):
            raise SimulationConfigError("confusion must be a non-empty square matrix")
        for row in self.confusion:
            if any(p < 0 for p in row) or not math.isclose(sum(row), 1.0, abs_tol=1e-9):
                raise SimulationConfigError(
                    f"each confusion row must be probabilities summing to 1, got {row}"
                )
        if not self.high > self.low:
            raise SimulationConfigError(f"need high > low, got [{self.low}, {self.high}]")

    @classmethod
    def adjacent(cls, num_bins: int, accuracy: float, low: float, high: float) -> BinConfusionPredictor:
        """Right bin with probability ``accuracy``, otherwise a neighbouring bin (split evenly)."""
        if not 0 <= accuracy <= 1:
            raise SimulationConfigError(f"accuracy must lie in [0, 1], got {accuracy}")
        rows = []
        for i in range(num_bins):
            neighbours = [j for j in (i - 1, i + 1) if 0 <= j < num_bins]
            row = [0.0] * num_bins
            row[i] = accuracy if neighbours else 1.0
            for j in neighbours:
                row[j] = (1.0 - accuracy) / len(neighbours)
            rows.append(tuple(row))
        return cls(tuple(rows), low, high)

    def predict(self, rng: np.random.Generator, true_lengths: np.ndarray) -> np.ndarray:
        k = len(self.confusion)
        cuts = np.asarray(equally_spaced_cuts(k, self.low, self.high))
        true_bins = np.searchsorted(cuts, true_lengths, side="right")
        cumulative = np.cumsum(np.asarray(self.confusion), axis=1)
        draws = rng.uniform(size=true_lengths.shape)
        predicted_bins = np.minimum((draws[:, None] > cumulative[true_bins]).sum(axis=1), k - 1)
        width = (self.high - self.low) / k
        return self.low + width * (predicted_bins + rng.uniform(size=true_lengths.shape))


# ----------------------------------------------------------------- workload


@dataclass(frozen=True)
class SimulatedWorkload:
    """A drawn workload as arrays indexed by request number: arrival, input, true output and
    predicted output, deadline."""

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    predicted_tokens: np.ndarray
    deadline_s: np.ndarray | None

    def __len__(self) -> int:
        return len(self.arrival_s)


def draw_workload(
    arrivals: PoissonArrivals | StepArrivals | OnOffArrivals,
    output_lengths: UniformLengths | GammaLengths | EmpiricalLengths,
    predictor: OraclePredictor | NoisyPredictor | BinConfusionPredictor,
    horizon_s: float,
    seed: int,
    *,
    input_lengths: UniformLengths | GammaLengths | EmpiricalLengths | None = None,
    relative_deadline_s: float | None = None,
) -> SimulatedWorkload:
    """Draw one workload; the same seed gives the same arrays, whatever policy later runs it."""
    _positive("horizon_s", horizon_s)
    rng = np.random.default_rng(seed)
    arrival = arrivals.times(rng, horizon_s)
    count = len(arrival)
    output = output_lengths.sample(rng, count)
    predicted = np.maximum(predictor.predict(rng, output), 0.0)
    inputs = (
        input_lengths.sample(rng, count).astype(np.int64)
        if input_lengths is not None
        else np.zeros(count, dtype=np.int64)
    )
    deadline = arrival + relative_deadline_s if relative_deadline_s is not None else None
    return SimulatedWorkload(arrival, inputs, output, predicted, deadline)


def _positive(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SimulationConfigError(f"{name} must be a finite number > 0, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise SimulationConfigError(f"{name} must be a finite number >= 0, got {value!r}")
