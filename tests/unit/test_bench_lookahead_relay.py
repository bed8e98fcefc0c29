"""bench_lookahead's relay: engines take turns, never step at the same time, and the
seconds a turn is charged cover every step it ran."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_lookahead import Relay


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
