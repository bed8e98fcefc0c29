"""Timing forward passes without stalling the device.

The goodput model needs each pass's cost, but waiting for the device after every
pass to read a clock would serialise host and device: on a GPU the next pass could
no longer be queued while the current one runs. On CUDA each pass is bracketed by
two events instead, and the times are read after the step's one synchronisation
(copying the committed tokens to the host). On the CPU operations are synchronous
and the wall clock is the pass time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

PassTimed = Callable[[float], None]


class PassClock:
    """Times passes on one device; ``record(seconds)`` runs once the time is known."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._device = device
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event, PassTimed]] = []

    def start(self) -> object:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, started: object, record: PassTimed) -> None:
        if not self._cuda:
            record(time.perf_counter() - started)
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending.append((started, end, record))

    def drain(self) -> None:
        """Wait until the device has run everything queued (nothing to wait for on the
        CPU). A wall-clock window that must hold exactly its own device work (a draft's
        catch-up, a step timed as a whole) is closed, or opened, after a drain: without
        one, work launched before it would land in the next window that synchronises."""
        if self._cuda:
            torch.cuda.synchronize(self._device)

    def settle(self) -> None:
        """Hand out the times of every pass stopped so far (waits for the last one)."""
        pending, self._pending = self._pending, []
        for start, end, record in pending:
            end.synchronize()
            record(start.elapsed_time(end) / 1000.0)
