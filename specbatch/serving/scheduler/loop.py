"""The scheduler's event loop on its own thread, supervised.

Triton calls `execute` on its own thread; everything the core does happens on this
loop, so the core needs no locks. Besides the instance connections, the loop wakes
for the policy's next deadline and polls for cancelled requests.

Supervised: if a scheduling tick raises, every prompt the core holds is answered with
the error and the loop goes on with a clean slate, so no request waits forever behind
a broken state. Shutdown answers queued prompts at once, lets running rows finish for
up to ``drain_s``, then answers whatever is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable

from specbatch.routing import GraphSolverPool
from specbatch.serving.scheduler.core import SchedulerCore
from specbatch.serving.scheduler.hub import InstanceHub

logger = logging.getLogger(__name__)


class SchedulerLoop:
    def __init__(
        self,
        core: SchedulerCore,
        hub: InstanceHub,
        solver: GraphSolverPool,
        cancel_poll_s: float = 0.1,
        drain_s: float = 20.0,
    ) -> None:
        self._core = core
        self._solver = solver
        self._drain_s = drain_s
        self._hub = hub
        self._cancel_poll_s = cancel_poll_s
        self._loop = asyncio.new_event_loop()
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specbatch-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the scheduler loop did not start")

    def call(self, function: Callable[..., None], *args: object) -> None:
        """Run ``function(*args)`` on the loop (from any thread); a failure is logged."""
        self._loop.call_soon_threadsafe(self._guarded, function, *args)

    def stop(self) -> None:
        """Drain and stop (from Triton's finalize); returns within about ``drain_s``."""
        if self._thread.is_alive() and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(self._drain_s + 5)

    def _guarded(self, function: Callable[..., None], *args: object) -> None:
        try:
            function(*args)
        except Exception:
            logger.exception("scheduler step %s failed", getattr(function, "__name__", function))

    def _supervised(self, function: Callable[[], None]) -> None:
        """A tick that raises leaves the core's state in doubt: answer everything it holds."""
        try:
            function()
        except Exception as exc:
            self._core.restart(exc)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stopped = asyncio.Event()
        await self._solver.start()
        await self._hub.start()
        self._ready.set()
        try:
            while not self._stopped.is_set():
                self._supervised(self._core.poll_cancellations)
                self._supervised(self._core.flush_streams)
                self._supervised(self._core.schedule)
                self._supervised(self._core.check_hung)
                self._guarded(self._core.report_queue)
                timeout = self._cancel_poll_s
                wake = self._core.next_wakeup_s()
                if wake is not None:
                    timeout = max(0.0, min(timeout, wake - time.monotonic()))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stopped.wait(), timeout)
        finally:
            await self._drain()
            await self._hub.stop()
            await self._solver.close()

    async def _drain(self) -> None:
        self._guarded(self._core.begin_shutdown)
        deadline = time.monotonic() + self._drain_s
        while self._core.running_rows and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self._guarded(self._core.fail_everything, "the server is shutting down")
