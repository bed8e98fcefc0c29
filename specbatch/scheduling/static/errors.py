"""The two errors only the static policy and its simulator raise; the rest are shared
(``specbatch.scheduling.errors``)."""

from __future__ import annotations

from specbatch.scheduling.errors import SchedulingError


class WorkerStateError(SchedulingError):
    """A worker event out of order: a batch asked for while one is in flight, or feedback for a
    batch that worker is not running."""


class SimulationConfigError(SchedulingError):
    """A simulator or workload parameter is out of range."""
