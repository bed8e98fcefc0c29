"""Multi-bin, memory- and SLA-aware dynamic batching: the policy core and its simulator.

The policy (``SchedulingPolicy``) is pure Python and clock-agnostic; the Triton scheduler
model drives it on the wall clock and ``specbatch.scheduling.simulate`` on a virtual one.
"""

from specbatch.scheduling.bins import BinBoundaries, BinQueues, equal_mass_cuts, equally_spaced_cuts
from specbatch.scheduling.config import PolicyConfig
from specbatch.scheduling.dynamic import MemoryBound, RunningStats, SlaBatchController, memory_batch_size
from specbatch.scheduling.errors import (
    DuplicateRequestError,
    InvalidRequestError,
    PolicyConfigError,
    SchedulingError,
    SimulationConfigError,
    UnknownWorkerError,
    WorkerStateError,
)
from specbatch.scheduling.policy import SchedulingPolicy
from specbatch.scheduling.requests import Batch, QueuedRequest

__all__ = [
    "Batch",
    "BinBoundaries",
    "BinQueues",
    "DuplicateRequestError",
    "InvalidRequestError",
    "MemoryBound",
    "PolicyConfig",
    "PolicyConfigError",
    "QueuedRequest",
    "RunningStats",
    "SchedulingError",
    "SchedulingPolicy",
    "SimulationConfigError",
    "SlaBatchController",
    "UnknownWorkerError",
    "WorkerStateError",
    "equal_mass_cuts",
    "equally_spaced_cuts",
    "memory_batch_size",
]
