"""Requests waiting on the scheduler, answered by the gateway if the scheduler dies.

Triton 2.51 never answers a request that a decoupled model's stub process held when it
died: the ensemble waits on it for good (measured: the clients waited out their own
90 s timeout, although the scheduler was unloaded and loaded again within 2 s and
served new requests). Whatever brings the scheduler back tells the gateway (SIGUSR1 to
its process), and every HTTP request then waiting on the scheduler is answered 503
"retry" and its upstream connection dropped. A request that reaches the dead scheduler
later gets Triton's own error, so nothing is left waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

SCHEDULER_LOST = "the scheduler failed while this request was pending and has been restarted; retry"
# Requests that pass through the scheduler: the ensemble and the scheduler model itself.
THROUGH_SCHEDULER = ("/v2/models/specbatch/", "/v2/models/scheduler/")


def waits_on_scheduler(path: str) -> bool:
    return path.startswith(THROUGH_SCHEDULER)


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
