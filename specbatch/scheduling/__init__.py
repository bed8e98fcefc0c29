"""What the server's scheduler runs: admission control over continuous-batching instances.

The Triton scheduler model (``specbatch.serving.scheduler``) uses what this package exports:
``AdmissionPolicy`` and ``AdmissionConfig`` (``admission``) decide whom to start on which
instance, how many rows it may run and when to refuse (``QueueFullError``); instances report
their state as ``InstanceLoad`` (``load``); prompts wait as ``QueuedRequest`` (``requests``).
The policy is built from length bins (``bins``) and b_SLA with running statistics
(``dynamic``), and raises the errors exported here (``errors``).

Beside it, never loaded by the server:

- ``simulate``: a step-level simulator that runs this same ``AdmissionPolicy`` on a virtual
  clock, and the command line of every scheduling experiment;
- ``static``: the batch-level policy of the source papers (an idle worker takes a whole batch)
  and the discrete-event simulator that evaluates it.
"""

from specbatch.scheduling.admission import AdmissionConfig, AdmissionPolicy, QueueFullError
from specbatch.scheduling.errors import (
    DuplicateRequestError,
    InvalidPolicyInputError,
    PolicyConfigError,
    SchedulingError,
    UnknownWorkerError,
)
from specbatch.scheduling.load import InstanceLoad
from specbatch.scheduling.requests import QueuedRequest

__all__ = [
    "AdmissionConfig",
    "AdmissionPolicy",
    "DuplicateRequestError",
    "InstanceLoad",
    "InvalidPolicyInputError",
    "PolicyConfigError",
    "QueueFullError",
    "QueuedRequest",
    "SchedulingError",
    "UnknownWorkerError",
]
