"""Requests the scheduler is still answering, watched for client cancellation.

Triton tells a decoupled model about a cancelled request only when asked
(`request.is_cancelled()`), so the dispatcher loop polls the requests that still
have prompts queued or running, a few times per decode step. Everything here runs on
that loop's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Pending:
    keys: list[tuple[int, int]]
    is_cancelled: Callable[[], bool]
    is_done: Callable[[], bool]


class PendingRequests:
    def __init__(self) -> None:
        self._pending: dict[int, _Pending] = {}

    def add(
        self,
        serial: int,
        keys: list[tuple[int, int]],
        is_cancelled: Callable[[], bool],
        is_done: Callable[[], bool],
    ) -> None:
        self._pending[serial] = _Pending(keys, is_cancelled, is_done)

    def __len__(self) -> int:
        return len(self._pending)

    def cancelled(self) -> list[tuple[int, int]]:
        """Prompt keys of requests the client cancelled since the last poll (each reported once).

        Requests answered in the meantime are forgotten without asking Triton.
        """
        keys = []
        for serial, pending in list(self._pending.items()):
            if pending.is_done():
                del self._pending[serial]
            elif pending.is_cancelled():
                keys.extend(pending.keys)
                del self._pending[serial]
        return keys
