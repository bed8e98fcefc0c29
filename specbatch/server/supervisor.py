"""Bring a model back when one of its stub processes dies: instances, router, scheduler.

Triton's Python backend runs each model instance in its own stub process, and does not
restart a stub that died (a crash, the OOM killer, or the scheduler ending an instance
it found hung): every later request to that model fails. The launcher watches the stub
processes of every model of the pipeline and reloads the model that lost one through
Triton's model-control API (explicit mode, restricted to the admin key):

- some of its instances still run: ``reload(model)``. Triton starts a full new set of
  instances and unloads the old set only once the new one is ready, so the survivors
  keep serving throughout (their running rows finish; see InstanceRunner.drain), and
  the server stays ready;
- none runs (the router's and the scheduler's one instance, or every decoding
  instance): ``restart(model)``, unload then load. While the model loads, Triton
  reports the server not ready, which is the truth: that step cannot serve.

A reload that fails is retried after ``retry_s``.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Container

logger = logging.getLogger(__name__)

Stubs = Callable[[], dict[int, str]]
_INSTANCE_SUFFIX = re.compile(r"_\d+_\d+$")
_UNSEEN = object()


def model_of(instance: str) -> str:
    """The model of a Triton instance name (``<model>_<group>_<index>``)."""
    return _INSTANCE_SUFFIX.sub("", instance)


class StubSupervisor:
    """Polls ``stubs()`` ({pid: instance name} of the live stub processes) and, for each
    model that lost a known pid, calls ``reload(model)`` or ``restart(model)``."""

    def __init__(
        self,
        stubs: Stubs,
        reload: Callable[[str], None],
        restart: Callable[[str], None],
        poll_s: float = 0.5,
        retry_s: float = 5.0,
        on_death: Callable[[str], None] | None = None,
        server: Callable[[], object] = lambda: None,
        ready_models: Callable[[], Container[str]] | None = None,
    ) -> None:
        """``on_death(model)`` runs when a death is seen, before the model is brought back.
        ``server()`` names the tritonserver watched: when it changes (tritonserver itself
        was restarted, and loads every model on its own) the stubs are learnt anew.
        ``ready_models()``: the models loaded and ready; a stub is watched only once its
        model is (a loading model's stubs include short-lived ones: Triton starts a stub
        to complete the model's configuration, which then exits). None: all are."""
        self._stubs = stubs
        self._on_death = on_death
        self._server = server
        self._server_seen: object = _UNSEEN
        self._ready_models = ready_models
        self._reload = reload
        self._restart = restart
        self._poll_s = poll_s
        self._retry_s = retry_s
        self._expected: dict[int, str] = {}
        self._retiring: set[int] = set()  # a reloaded model's old stubs, free to leave
        self._not_before: dict[str, float] = {}
        self.restarts = 0
        self.restarted_models: list[str] = []
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
        """One look at the stubs; brings back every model a stub the last look saw has died
        of, and watches from now on every stub that appeared since (a model loaded later)."""
        server = self._server()
        if server != self._server_seen:
            self._server_seen = server
            self._expected, self._retiring, self._not_before = {}, set(), {}
        current = self._stubs()
        dead = {pid: name for pid, name in self._expected.items() if pid not in current}
        for model in sorted({model_of(name) for name in dead.values()}):
            if self._on_death is not None and model not in self._not_before:
                self._on_death(model)
            if time.monotonic() < self._not_before.get(model, 0.0):
                continue
            self._bring_back(model, current)
        self._learn(current)

    def _learn(self, current: dict[int, str]) -> None:
        self._retiring &= set(current)
        unknown = {
            pid: name
            for pid, name in current.items()
            if pid not in self._expected
            and pid not in self._retiring
            and model_of(name) not in self._not_before
        }
        if not unknown:
            return
        try:
            ready = None if self._ready_models is None else self._ready_models()
        except Exception:  # the server is not answering yet: learn them at a later look
            return
        learnt = {pid: name for pid, name in unknown.items() if ready is None or model_of(name) in ready}
        if learnt:
            logger.info("watching %s", ", ".join(f"{name} ({pid})" for pid, name in sorted(learnt.items())))
        self._expected.update(learnt)

    def _bring_back(self, model: str, before: dict[int, str]) -> None:
        survivors = [pid for pid, name in before.items() if pid in self._expected and model_of(name) == model]
        logger.error(
            "a process of model %s died; %s",
            model,
            "reloading it" if survivors else "no instance of it is left: restarting it",
        )
        started = time.monotonic()
        try:
            (self._reload if survivors else self._restart)(model)
            new = {
                pid: name
                for pid, name in self._stubs().items()
                if model_of(name) == model and pid not in before
            }
            if not new:
                raise RuntimeError(f"Triton loaded {model} but started no new process for it")
            self._not_before.pop(model, None)
        except Exception:
            logger.exception("bringing back %s failed; retrying in %.0f s", model, self._retry_s)
            self._not_before[model] = time.monotonic() + self._retry_s
            return
        # The model's new stubs are expected from now on; its old ones may leave quietly.
        self._retiring |= {pid for pid, name in before.items() if model_of(name) == model}
        self._expected = {pid: name for pid, name in self._expected.items() if model_of(name) != model}
        self._expected.update(new)
        with self._restarted:
            self.restarts += 1
            self.restarted_models.append(model)
            self._restarted.notify_all()
        back_s = time.monotonic() - started
        logger.info("%s back in %.1f s: %s", model, back_s, ", ".join(sorted(new.values())))

    def _run(self) -> None:
        while not self._stopping.wait(self._poll_s):
            try:
                self.check()
            except Exception:  # a failed look must not end the watch
                logger.exception("watching the model processes failed")
