"""Requests waiting on the scheduler, answered by the front that took them if it dies.

Triton 2.51 never answers a request that a decoupled model's stub process held when it
died: the ensemble (and the scheduler called directly) waits on it for good (measured:
the clients waited out their own 90 s timeout, although the scheduler was unloaded and
loaded again within 2 s and served new requests). Whatever brings the scheduler back
tells the fronts (SIGUSR1 to the gateway's and the OpenAI front's processes), and each
answers every request it has waiting on the scheduler with 503 "retry" and drops its
upstream call. A request that reaches the dead scheduler later gets Triton's own
error, so nothing is left waiting. (A gRPC client of Triton itself has no front of
ours: its stream waits for its own deadline.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

SCHEDULER_LOST = "the scheduler failed while this request was pending and has been restarted; retry"
# The models whose requests wait on the scheduler: the ensemble and the scheduler itself.
SCHEDULER_MODELS = ("specbatch", "scheduler")


class HeldRequests:
    """The requests now waiting on the scheduler, each with a future that `fail_all` sets."""

    def __init__(self) -> None:
        self._waiting: set[asyncio.Future[str]] = set()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[asyncio.Future[str]]:
        failed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.add(failed)
        try:
            yield failed
        finally:
            self._waiting.discard(failed)

    def fail_all(self, message: str = SCHEDULER_LOST) -> int:
        """Answer every waiting request with ``message``; how many there were."""
        pending = [failed for failed in self._waiting if not failed.done()]
        for failed in pending:
            failed.set_result(message)
        return len(pending)

    def __len__(self) -> int:
        return len(self._waiting)
