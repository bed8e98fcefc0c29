"""bench_lookahead's relay: engines take turns, never step at the same time, and the
seconds a turn is charged cover every step it ran; a window is counted in requests ended
and charged only the turns' seconds inside it."""

from __future__ import annotations

import queue
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_continuous import Job
from bench_lookahead import ClosedLoop, Relay, held_between


class _Stepper:
    """Stands in for an engine's loop: the step hook, then a step of busy work."""

    def __init__(self, relay: Relay, name: str, shared: dict) -> None:
        self.name, self.shared = name, shared
        self.hook = relay.gate(name)
        self.steps: list[tuple[float, float]] = []
        self.stopping = threading.Event()
        self.loop_thread = threading.Thread(target=self._run, daemon=True)
        self.loop_thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            self.hook()
            with self.shared["lock"]:
                self.shared["inside"] += 1
                self.shared["most"] = max(self.shared["most"], self.shared["inside"])
            started = time.perf_counter()
            sum(range(20_000))
            self.steps.append((started, time.perf_counter()))
            with self.shared["lock"]:
                self.shared["inside"] -= 1


def test_engines_take_turns_and_each_turn_covers_its_steps() -> None:
    relay = Relay()
    shared = {"lock": threading.Lock(), "inside": 0, "most": 0}
    steppers = [_Stepper(relay, name, shared) for name in ("a", "b", "c")]
    turns: list[tuple[_Stepper, float, float]] = []
    for _ in range(5):
        for stepper in steppers:
            started = time.perf_counter()
            since, to = relay.hold(stepper.name, stepper, 0.01)
            turns.append((stepper, started, time.perf_counter()))
            assert to - since >= 0.01 and started <= since
    most_at_once = shared["most"]
    relay.open()  # now every stepper may step at once, to wind down
    for stepper in steppers:
        stepper.stopping.set()
        stepper.loop_thread.join(timeout=10)
        assert not stepper.loop_thread.is_alive()
    assert most_at_once == 1  # never two engines stepping at once while the relay held them
    for stepper in steppers:
        assert stepper.steps
        mine = [(start, end) for s, start, end in turns if s is stepper]
        timed = [step for step in stepper.steps if step[1] <= turns[-1][2]]
        # every step it ran before the relay opened lies inside one of its own turns
        assert all(any(start <= s and e <= end for start, end in mine) for s, e in timed)


def test_only_the_turns_seconds_inside_the_window_are_charged() -> None:
    turns = [(0.0, 1.0), (2.0, 3.0), (4.0, 5.0)]
    assert held_between(turns, 0.5, 4.25) == pytest.approx(0.5 + 1.0 + 0.25)
    assert held_between(turns, 1.0, 2.0) == 0.0


class _HandEngine:
    """Takes each submitted request and lets the test end it (a cancel ends it too)."""

    def __init__(self) -> None:
        self.submitted: queue.Queue = queue.Queue()

    def submit(self, request, sink, mode):
        self.submitted.put((request, sink))
        return sink

    def cancel(self, handle) -> None:
        handle.on_finished(0, None)


def test_the_window_opens_and_closes_on_requests_ended_with_the_tokens_streamed_by_then() -> None:
    engine = _HandEngine()
    jobs = [Job(prompt=[1, 2], new_tokens=n) for n in (3, 5, 7, 11, 13, 17)]
    loop = ClosedLoop(engine, jobs, 1, "speculative", window_from=2, window_to=4)
    for ended in range(1, 6):
        request, sink = engine.submitted.get(timeout=30)
        sink.on_tokens({0: [0] * request.max_new_tokens})
        sink.on_finished(0, None)
        if ended == 1:
            assert loop.window_start is None
        if ended == 3:
            assert loop.window_end is None
    loop.stop()
    assert loop.window_start[1] == 3 + 5
    assert loop.window_end[1] == 3 + 5 + 7 + 11
    assert loop.window_start[0] <= loop.window_end[0]
