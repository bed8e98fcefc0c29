"""Errors the admission policy and its building blocks raise.

All of them subclass ValueError so callers that only guard against bad input
(``except ValueError``) still catch them, while the message names the mistake. The static
batch-level policy adds its own two in ``specbatch.scheduling.static.errors``.
"""

from __future__ import annotations


class SchedulingError(ValueError):
    """Base class: a caller handed the policy something it cannot act on."""


class PolicyConfigError(SchedulingError):
    """A policy configuration field (AdmissionConfig, or the static PolicyConfig) is out of range
    or contradicts another field."""


class InvalidPolicyInputError(SchedulingError):
    """A QueuedRequest, or a worker's report to a policy, carries values no request or report
    can have (negative tokens, NaN times)."""


class DuplicateRequestError(SchedulingError):
    """A request id is submitted while a request with the same id is still queued."""


class UnknownWorkerError(SchedulingError):
    """An instance or worker id the policy does not know."""
