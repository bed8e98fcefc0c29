"""Bring a model's instances back when one of their processes dies.

Triton's Python backend runs each model instance in its own stub process, and does not
restart a stub that died (a crash, the OOM killer, or the scheduler ending an instance
it found hung). The launcher watches the stubs of the decoding model and reloads the
model through Triton's model-control API (explicit mode, restricted to the admin key):

- some instances still run: ``load`` again. Triton starts a full new set of instances
  and unloads the old set only once the new one is ready, so the survivors keep
  serving throughout (their running rows finish; see InstanceRunner.drain), and the
  server stays ready;
- none runs: ``unload`` then ``load``. While the model loads, Triton reports the
  server not ready, which is the truth: nothing can serve.

A reload that fails is retried after ``retry_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

Stubs = Callable[[], dict[int, str]]


class InstanceSupervisor:
    """Polls ``stubs()`` ({pid: instance name} of the model's live stub processes) and
    calls ``reload()`` or ``restart()`` (unload, then load) when a known pid is gone."""

    def __init__(
        self,
        stubs: Stubs,
        reload: Callable[[], None],
        restart: Callable[[], None],
        poll_s: float = 0.5,
        retry_s: float = 5.0,
    ) -> None:
        self._stubs = stubs
        self._reload = reload
        self._restart = restart
        self._poll_s = poll_s
        self._retry_s = retry_s
        self._expected: set[int] | None = None
        self._not_before = 0.0
        self.restarts = 0
        self._restarted = threading.Condition()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specbatch-supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (before the server stops: its stubs are about to exit)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def wait_for_restarts(self, count: int, timeout_s: float) -> bool:
        """Block until ``count`` restarts have completed (or the timeout); whether they have."""
        with self._restarted:
            return self._restarted.wait_for(lambda: self.restarts >= count, timeout_s)

    def check(self) -> None:
        """One look at the stubs; reloads the model if one the last look saw has died."""
        current = self._stubs()
        if self._expected is None:
            self._expected = set(current)
            return
        dead = self._expected - set(current)
        if not dead or time.monotonic() < self._not_before:
            return
        survivors = self._expected & set(current)
        logger.error(
            "model instance process(es) %s died; %s",
            ", ".join(f"{pid}" for pid in sorted(dead)),
            "reloading the model" if survivors else "no instance is left: restarting the model",
        )
        started = time.monotonic()
        try:
            (self._reload if survivors else self._restart)()
        except Exception:
            logger.exception("restarting the model's instances failed; retrying in %.0f s", self._retry_s)
            self._not_before = time.monotonic() + self._retry_s
            return
        after = self._stubs()
        self._expected = set(after) - set(current)
        with self._restarted:
            self.restarts += 1
            self._restarted.notify_all()
        logger.info(
            "model instances back in %.1f s: %s",
            time.monotonic() - started,
            ", ".join(sorted(after[pid] for pid in self._expected)),
        )

    def _run(self) -> None:
        while not self._stopping.wait(self._poll_s):
            try:
                self.check()
            except Exception:  # a failed look must not end the watch
                logger.exception("watching the model instances failed")
