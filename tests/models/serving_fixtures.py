"""The serving path without Triton: real engines over the tiny pair (the ``tiny_pair``
fixture), instance runners, and a scheduler core on an asyncio loop with those runners
behind fake connections.

Every message between the core and a runner is framed and decoded back, so the tests see
exactly what crosses the socket in the server.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from serving_helpers import RecordingReply, over_the_wire

from specbatch.decoding import Engine, ModelPair
from specbatch.routing import solve_graph
from specbatch.scheduling.admission import AdmissionConfig, AdmissionPolicy
from specbatch.scheduling.load import InstanceLoad
from specbatch.serving.instance.runner import InstanceRunner
from specbatch.serving.messages import Done, Message, RowOutcome, Step
from specbatch.serving.params import PromptError, ServingLimits
from specbatch.serving.scheduler.core import CoreSettings, SchedulerCore, SchedulerEvents
from specbatch.serving.scheduler.intake import RequestIntake, RoutedRequest
from specbatch.serving.target_text import TargetText

WAIT_S = 120.0  # generous: the machine running the tests may be busy with other work
LONG_ROW_TOKENS = 1500  # a row that is certainly still running when a test acts on it
IDLE_LOAD = InstanceLoad(blocks_total=256, blocks_free=256, block_size=16)


def make_engine(pair: ModelPair) -> Engine:
    """A small engine: fixed lookahead (no calibration), 256 KV blocks of 16 tokens."""
    return Engine(pair, lookahead=2, kv_memory_budget_bytes=1 << 26)


class Inbox:
    """Collects a runner's messages (from any thread) and waits for a condition on them."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self._changed = threading.Condition()

    def __call__(self, message: Message) -> None:
        with self._changed:
            self.messages.append(over_the_wire(message))
            self._changed.notify_all()

    def wait_until(self, predicate: Callable[[], bool], what: str) -> None:
        with self._changed:
            assert self._changed.wait_for(predicate, WAIT_S), f"timed out waiting for {what}"

    def of_type(self, kind: str) -> list[Message]:
        with self._changed:
            return [m for m in self.messages if kind == m.TYPE]

    def done(self) -> dict[int, list[RowOutcome]]:
        """Every done message's outcome, per row."""
        outcomes: dict[int, list[RowOutcome]] = defaultdict(list)
        for message in self.of_type(Done.TYPE):
            outcomes[message.row].append(message.outcome)
        return outcomes

    def wait_done(self, rows: set[int]) -> dict[int, list[RowOutcome]]:
        self.wait_until(lambda: rows <= {m.row for m in self.messages if m.TYPE == Done.TYPE}, f"{rows}")
        return self.done()

    def wait_started(self, row: int) -> None:
        self.wait_until(
            lambda: any(row in m.first for m in self.messages if m.TYPE == Step.TYPE),
            f"row {row} to start",
        )

    def deltas(self, row: int) -> list[str]:
        return [text for m in self.of_type(Step.TYPE) for r, text, _ in m.deltas if r == row]

    def delta_logprobs(self, row: int) -> list[str]:
        """The JSON log-probabilities beside each of ``row``'s deltas, in order."""
        return [logprobs for m in self.of_type(Step.TYPE) for r, _, logprobs in m.deltas if r == row]


class _Channel:
    """The core's side of an instance's connection: messages go to the runner as read off
    the socket. The runner starts rows on the caller's thread (the loop) without waiting
    for them, as the link's reader thread does in the server."""

    def __init__(self, cluster: Cluster, name: str, runner: InstanceRunner | None) -> None:
        self._cluster = cluster
        self._name = name
        self._runner = runner

    def send(self, message: Message) -> None:
        message = over_the_wire(message)
        self._cluster.received[self._name].append(message)
        if self._runner is not None and self._name not in self._cluster.dead:
            self._runner.handle(message)

    def terminate(self) -> None:
        self._cluster.terminated.append(self._name)


class Cluster:
    """A SchedulerCore on the running asyncio loop, and instances joining and leaving it.

    A runner reports from its engine's thread; as the hub does, every message is handled
    on the loop (``call_soon_threadsafe``). A lost instance's later messages are dropped,
    as a closed connection drops them.
    """

    def __init__(
        self,
        pair: ModelPair | None,
        directory: Path,
        *,
        queue_limit: int = 256,
        admission: AdmissionConfig | None = None,
        events: SchedulerEvents | None = None,
        clock: Callable[[], float] = time.monotonic,
        hang_after_s: float = 60.0,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.pair = pair
        self.intake = RequestIntake(
            ServingLimits(max_tokens_cap=2048, default_max_tokens=16),
            TargetText.load(str(directory / "target")),
            time.monotonic,
        )
        self.core = SchedulerCore(
            self.intake,
            AdmissionPolicy(admission or AdmissionConfig(queue_limit=queue_limit)),
            solve_inline,
            settings=CoreSettings(
                generation_mode="speculative", fallback_tokens=4, hang_after_s=hang_after_s
            ),
            events=events,
            clock=clock,
        )
        self.runners: dict[str, InstanceRunner] = {}
        self.received: dict[str, list[Message]] = defaultdict(list)  # core -> instance
        self.reported: dict[str, list[Message]] = defaultdict(list)  # instance -> core
        self.dead: set[str] = set()
        self.channels: dict[str, _Channel] = {}
        self.terminated: list[str] = []
        self._muted: set[str] = set()
        self._changed = asyncio.Event()

    def join(self, name: str, *, dies_before_finishing: bool = False) -> InstanceRunner:
        """Start an instance on its own engine; with ``dies_before_finishing`` its done
        messages never reach the core (the process dies before it sends them)."""
        runner = InstanceRunner(make_engine(self.pair), name, lambda m: self._from_instance(name, m))
        self.runners[name] = runner
        if dies_before_finishing:
            self._muted.add(name)
        hello = over_the_wire(runner.hello("cpu"))
        self.channels[name] = _Channel(self, name, runner)
        self.core.instance_joined(hello.instance, hello.load, self.channels[name])
        return runner

    def join_scripted(self, name: str, load: InstanceLoad | None = None) -> _Channel:
        """An instance the test plays itself: the core's messages are only recorded, and the
        test answers with ``self.core.instance_step/instance_done`` on the returned
        connection (a name that joins again gets a new connection)."""
        load = load or IDLE_LOAD
        self.channels[name] = _Channel(self, name, None)
        self.core.instance_joined(name, load, self.channels[name])
        return self.channels[name]

    def lose(self, name: str) -> None:
        """The instance's process died: its connection closes and its rows go nowhere."""
        self.dead.add(name)
        self.core.instance_lost(self.channels[name], "its connection closed")
        self.runners[name].cancel_all()

    def reply(self) -> RecordingReply:
        return RecordingReply(self._changed.set)

    def submit(self, request: RoutedRequest, reply: RecordingReply | None = None) -> RecordingReply:
        reply = reply or self.reply()
        self.core.submit(request, reply)
        return reply

    async def until(self, predicate: Callable[[], bool], what: str) -> None:
        """Wait (on events, never by polling a clock) until ``predicate()`` holds."""
        deadline = self.loop.time() + WAIT_S
        while not predicate():
            self._changed.clear()
            remaining = deadline - self.loop.time()
            assert remaining > 0, f"timed out waiting for {what}"
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                raise AssertionError(f"timed out waiting for {what}") from None

    async def answer(self, reply: RecordingReply) -> list[RowOutcome]:
        await self.until(lambda: bool(reply.finals), "the request's final response")
        return reply.finals[0]

    def started(self, name: str, rows: int = 1) -> Callable[[], bool]:
        """A predicate: instance ``name`` reported ``rows`` rows' first tokens."""
        return lambda: sum(len(m.first) for m in self.reported[name] if m.TYPE == Step.TYPE) >= rows

    def close(self) -> None:
        for name, runner in self.runners.items():
            self.dead.add(name)
            runner.cancel_all()

    def _from_instance(self, name: str, message: Message) -> None:
        message = over_the_wire(message)
        self.loop.call_soon_threadsafe(self._deliver, name, message)

    def _deliver(self, name: str, message: Message) -> None:
        if name in self.dead or (isinstance(message, Done) and name in self._muted):
            return
        self.reported[name].append(message)
        if isinstance(message, Step):
            self.core.instance_step(self.channels[name], message.first, message.deltas, message.load)
        elif isinstance(message, Done):
            self.core.instance_done(self.channels[name], message.row, message.outcome, message.load)
        self._changed.set()


def run_cluster(pair: ModelPair | None, directory: Path, scenario: Callable, **options: Any) -> None:
    """Run ``await scenario(cluster)`` on a fresh loop; every instance's rows end after."""

    async def main() -> None:
        cluster = Cluster(pair, directory, **options)
        try:
            await scenario(cluster)
        finally:
            cluster.close()

    asyncio.run(main())


async def solve_inline(text: str) -> str:
    """The graph solver on the caller's thread: enough for tests of the core's flow."""
    try:
        return solve_graph(text)
    except ValueError as exc:
        raise PromptError(f"graph prompt: {exc}") from None
