"""The batch-level policy of the source papers, and the simulator that evaluates it.

Not what the server runs. The live scheduler admits prompts, one at a time, to instances
that batch at every step (``specbatch.scheduling.admission``); the server process never
imports this package. Here an idle worker takes a whole batch and runs it to completion,
the setting of multi-bin batching (Guldogan et al. 2024) and of dynamic batch sizes
min(b_mem, b_SLA) (Pang et al. 2025):

- ``policy.SchedulingPolicy`` with ``config.PolicyConfig``: bins, fixed B or min(b_mem, b_SLA),
  flush windows, the starvation guard, deadlines;
- ``bins.BinQueues``, ``batch.Batch``, ``memory.memory_batch_size`` (Algorithm 1): its parts;
- ``simulate``: the discrete-event simulator and the experiments that reproduce the papers
  with this policy (run them with ``python -m specbatch.scheduling.simulate``).

It shares with the admission policy the bin edges (``scheduling.bins``), b_SLA and running
statistics (``scheduling.dynamic``), the errors and ``QueuedRequest``.
"""

from specbatch.scheduling.static.batch import Batch
from specbatch.scheduling.static.bins import BinQueues
from specbatch.scheduling.static.config import PolicyConfig
from specbatch.scheduling.static.errors import SimulationConfigError, WorkerStateError
from specbatch.scheduling.static.memory import MemoryBound, memory_batch_size
from specbatch.scheduling.static.policy import SchedulingPolicy

__all__ = [
    "Batch",
    "BinQueues",
    "MemoryBound",
    "PolicyConfig",
    "SchedulingPolicy",
    "SimulationConfigError",
    "WorkerStateError",
    "memory_batch_size",
]
