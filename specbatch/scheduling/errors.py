"""Errors the scheduling layer raises.

All of them subclass ValueError so callers that only guard against bad input
(``except ValueError``) still catch them, while the message names the mistake.
"""

from __future__ import annotations


class SchedulingError(ValueError):
    """Base class: a caller handed the policy something it cannot act on."""


class PolicyConfigError(SchedulingError):
    """A PolicyConfig field is out of range or contradicts another field."""


class InvalidRequestError(SchedulingError):
    """A QueuedRequest carries values no request can have (negative tokens, NaN times)."""


class DuplicateRequestError(SchedulingError):
    """A request id is submitted while a request with the same id is still queued."""


class UnknownWorkerError(SchedulingError):
    """A worker id the policy was not constructed with."""


class WorkerStateError(SchedulingError):
    """A worker event out of order: a batch asked for while one is in flight, or feedback for a
    batch that worker is not running."""


class SimulationConfigError(SchedulingError):
    """A simulator or workload parameter is out of range."""
