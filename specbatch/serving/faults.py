"""Fault injection for tests: prompts that make a chosen part of the server fail.

The serving path calls a `FaultHooks` object at a few points; the server's default
hooks do nothing. Only with SPECBATCH_FAULT_INJECTION=1 in the server's environment
does `fault_hooks()` return `PromptFaults`, where a prompt containing
``[[fault:scheduler]]`` makes the scheduler's loop raise while it schedules,
``[[fault:instance]]`` makes the engine step of the instance running it raise,
``[[fault:hang]]`` makes that engine step block for good (a hung instance),
``[[fault:hold]]`` makes it wait until the file named by SPECBATCH_FAULT_RELEASE exists
(rows held in place while a test acts, then let go; a holding process says so with a
file beside it, ``<release>.held.<pid>``), and ``[[fault:reply]]`` makes
building its request's final response raise. The tests use them to prove that every
request still gets exactly one final answer.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Collection, Sequence
from pathlib import Path

ENV = "SPECBATCH_FAULT_INJECTION"
RELEASE_ENV = "SPECBATCH_FAULT_RELEASE"
RELEASE_POLL_S = 0.02
logger = logging.getLogger(__name__)


class InjectedFault(RuntimeError):
    """Raised on purpose by a marked prompt."""


class FaultHooks:
    """The points where a test may break the serving path; here, each does nothing."""

    def request_arrived(self, reply: object, prompts: Sequence[str]) -> None:
        """The scheduler took a request answered through ``reply``."""

    def before_schedule(self) -> None:
        """The scheduler is about to shed and start prompts."""

    def before_final(self, reply: object) -> None:
        """``reply`` is about to build its request's final response."""

    def row_started(self, row: int, prompt: str) -> None:
        """An instance started ``row`` on its engine."""

    def before_step(self, rows: Collection[int]) -> None:
        """An instance's engine is about to step, holding ``rows``."""

    def row_ended(self, row: int) -> None:
        """An instance is done with ``row``."""


class PromptFaults(FaultHooks):
    """Faults asked for by markers in the prompts themselves."""

    def __init__(self, release_file: Path | None = None) -> None:
        self._release_file = release_file
        self._schedule_fault = False
        self._reply_faults: weakref.WeakSet[object] = weakref.WeakSet()
        self._lock = threading.Lock()  # rows start on the link's thread, steps on the engine's
        self._failing_rows: set[int] = set()
        self._hanging_rows: set[int] = set()
        self._holding_rows: set[int] = set()

    def request_arrived(self, reply: object, prompts: Sequence[str]) -> None:
        self._schedule_fault |= any(_asks(p, "scheduler") for p in prompts)
        if any(_asks(p, "reply") for p in prompts):
            self._reply_faults.add(reply)

    def before_schedule(self) -> None:
        if self._schedule_fault:
            self._schedule_fault = False
            raise InjectedFault("injected scheduler fault")

    def before_final(self, reply: object) -> None:
        if reply in self._reply_faults:
            self._reply_faults.discard(reply)
            raise InjectedFault("injected reply fault")

    def row_started(self, row: int, prompt: str) -> None:
        with self._lock:
            if _asks(prompt, "instance"):
                self._failing_rows.add(row)
            if _asks(prompt, "hang"):
                self._hanging_rows.add(row)
            if _asks(prompt, "hold"):
                self._holding_rows.add(row)

    def before_step(self, rows: Collection[int]) -> None:
        with self._lock:
            failing = not self._failing_rows.isdisjoint(rows)
            hanging = not self._hanging_rows.isdisjoint(rows)
            holding = not self._holding_rows.isdisjoint(rows)
        if failing:
            raise InjectedFault("injected instance fault")
        if hanging:
            logger.error("injected hang")
            threading.Event().wait()
        if holding:
            self._wait_for_release()

    def _wait_for_release(self) -> None:
        """Block the engine step until the release file exists: the test's signal crosses
        the process boundary as a file, and the step then goes on as if never held.
        Once released, later steps of the marked row run without saying they hold."""
        if self._release_file is None:
            raise InjectedFault(f"[[fault:hold]] needs {RELEASE_ENV}")
        if self._release_file.exists():
            return
        held_file(self._release_file, os.getpid()).touch()
        while not self._release_file.exists():
            time.sleep(RELEASE_POLL_S)

    def row_ended(self, row: int) -> None:
        with self._lock:
            self._failing_rows.discard(row)
            self._hanging_rows.discard(row)
            self._holding_rows.discard(row)


def fault_hooks() -> FaultHooks:
    """The hooks a server process wires in at start-up."""
    if os.environ.get(ENV) != "1":
        return FaultHooks()
    release = os.environ.get(RELEASE_ENV)
    return PromptFaults(Path(release) if release else None)


def held_file(release_file: Path, pid: int) -> Path:
    """The file by which process ``pid`` says it holds a row until ``release_file`` exists."""
    return release_file.with_name(f"{release_file.name}.held.{pid}")


def _asks(text: str, where: str) -> bool:
    return f"[[fault:{where}]]" in text
