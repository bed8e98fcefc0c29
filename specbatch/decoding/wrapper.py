"""The blocking face of the engine: submit a list of requests, wait for all of them.

Scripts, benchmarks and tests call :meth:`Engine.generate`; this sink
collects that call's rows, forwards per-step tokens and per-row results to the
caller's callbacks, turns ``is_cancelled`` answers into cancellations, and wakes the
caller when the last row is done.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from specbatch.decoding.requests import GenerationResult
from specbatch.decoding.rows import RowHandle


class BatchSink:
    """The sink of one :meth:`Engine.generate` call. It is handed the engine's ``cancel``
    rather than the engine, so this module needs nothing from the engine's."""

    def __init__(
        self,
        count: int,
        on_step: Callable[[dict[int, list[int]]], None] | None,
        on_finished: Callable[[int, GenerationResult], None] | None,
        is_cancelled: Callable[[int], bool] | None,
    ) -> None:
        self._results: list[GenerationResult | None] = [None] * count
        self._missing = count
        self._on_step = on_step
        self._on_finished = on_finished
        self._is_cancelled = is_cancelled
        self._cancel: Callable[[RowHandle], None] | None = None
        self._handles: Sequence[RowHandle] = ()
        self._done = threading.Event()
        self._bound = threading.Event()
        if count == 0:
            self._done.set()

    def bind(self, cancel: Callable[[RowHandle], None], handles: Sequence[RowHandle]) -> None:
        """The rows were queued: ``is_cancelled`` answers may now cancel them."""
        self._cancel, self._handles = cancel, handles
        self._bound.set()

    def on_tokens(self, updates: dict[int, list[int]]) -> None:
        if self._on_step is not None:
            self._on_step(updates)
        if self._is_cancelled is not None and self._bound.wait():
            for key, result in enumerate(self._results):
                if result is None and self._is_cancelled(key):
                    self._cancel(self._handles[key])

    def on_finished(self, key: int, result: GenerationResult) -> None:
        self._results[key] = result
        self._missing -= 1
        try:
            if self._on_finished is not None:
                self._on_finished(key, result)
        finally:
            if self._missing == 0:
                self._done.set()

    def wait(self) -> list[GenerationResult]:
        """Every row's result in request order; a row the engine failed raises here."""
        self._done.wait()
        failed = [r for r in self._results if r is not None and r.finish_reason == "error"]
        if failed:
            raise RuntimeError(failed[0].error)
        return [r for r in self._results if r is not None]
