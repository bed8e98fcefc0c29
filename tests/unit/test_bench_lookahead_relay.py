"""bench_lookahead's relay: engines take turns, never step at the same time, and the
seconds a turn is charged cover every step it ran."""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_continuous import Job
from bench_lookahead import ClosedLoop, Relay


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
            held = relay.hold(stepper.name, stepper, 0.01)
            turns.append((stepper, started, time.perf_counter()))
            assert held >= 0.01
    for stepper in steppers:  # each winds down alone, holding the relay

        def wind_down(stepper: _Stepper = stepper) -> None:
            stepper.stopping.set()
            stepper.loop_thread.join(timeout=10)

        relay.alone(stepper.name, stepper, wind_down)
        assert not stepper.loop_thread.is_alive()
    assert shared["most"] == 1  # never two engines stepping at once, winding down included
    for stepper in steppers:
        assert stepper.steps
        mine = [(start, end) for s, start, end in turns if s is stepper]
        timed = [step for step in stepper.steps if step[1] <= turns[-1][2]]
        # every step it ran before winding down lies inside one of its own turns
        assert all(any(start <= s and e <= end for start, end in mine) for s, e in timed)


class _ScramblingEngine:
    """Stands in for an engine: answers each request after a delay drawn at random, so
    requests end in an order unrelated to the order they were sent, and records which
    client (its sink) sent which prompt."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.sent: dict[int, list[int]] = {}
        self.lock = threading.Lock()

    def submit(self, request, sink, mode: str):
        with self.lock:
            self.sent.setdefault(id(sink), []).append(request.prompt[0])
            delay = self.random.random() * 0.004
        threading.Timer(delay, sink.on_finished, args=(0, None)).start()
        return object()

    def cancel(self, handle) -> None:
        """Nothing runs long enough to need cancelling."""


def test_each_client_serves_its_own_share_of_the_requests_whatever_order_they_end_in() -> None:
    # which rows decode together decides what a pass costs; dealt first come first
    # served it followed the order earlier rows happened to finish in, so two engines
    # of identical passes ran different batches
    jobs = [Job([position], 1) for position in range(40)]
    shares = []
    for seed in (1, 2):
        engine = _ScramblingEngine(seed)
        loop = ClosedLoop(engine, jobs, concurrency=4, mode="speculative", limit=22)
        assert loop.finished.wait(timeout=30)
        shares.append(sorted(engine.sent.values()))
    expected = sorted(list(range(client, 22, 4)) for client in range(4))
    assert shares == [expected, expected]
