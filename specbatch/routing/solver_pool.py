"""Graph prompts solved off the caller's event loop, in worker processes, under a time limit.

Yen's algorithm is pure Python: a graph within every size limit can still take seconds
(and a zero-weight clique takes exponential time in the spur search), and on the
scheduler's event loop that stalls every other request. A thread would not help: it
shares the GIL with the loop and cannot be stopped when the time limit passes. So each
solve runs in a worker process (:mod:`.solver_worker`) that is killed and replaced when
it overruns; the caller gets a :class:`GraphTimeoutError` for that prompt, and the pool
keeps serving.

Concurrency is bounded twice: at most ``workers`` solves run at once, and at most
``max_waiting`` callers wait for a worker; beyond that :class:`SolverBusyError` answers
at once (overload, not a bad prompt). A pool belongs to the event loop that first uses
it: create it, ``await pool.start()`` and ``await pool.close()`` on that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from types import TracebackType

from .errors import GraphError, GraphLimitError, GraphTimeoutError

# An answer holds at most MAX_PATHS paths of at most MAX_NODES nodes: far below this.
_LINE_LIMIT = 16 * 1024 * 1024
_ERRORS = {"limit": GraphLimitError, "graph": GraphError}


class SolverUnavailableError(RuntimeError):
    """The solver cannot take this prompt now (shut down, or its worker process died)."""


class SolverBusyError(SolverUnavailableError):
    """Every worker is busy and the waiting line is full: overload, answered at once."""


class _Worker:
    """One solver process, started on first use and replaced after a kill or a crash."""

    def __init__(self, python: str, start_timeout_s: float) -> None:
        self.python = python
        self.start_timeout_s = start_timeout_s
        self.process: asyncio.subprocess.Process | None = None
        self.restarts = 0

    async def ensure_started(self) -> asyncio.subprocess.Process:
        if self.process is not None and self.process.returncode is None:
            return self.process
        if self.process is not None:
            self.restarts += 1
        process = await asyncio.create_subprocess_exec(
            self.python,
            "-m",
            "specbatch.routing.solver_worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=_LINE_LIMIT,
        )
        self.process = process
        try:
            ready = await asyncio.wait_for(process.stdout.readline(), self.start_timeout_s)
        except asyncio.TimeoutError:
            await self.kill()
            raise SolverUnavailableError(
                f"graph solver process did not start within {self.start_timeout_s:g} s"
            ) from None
        except BaseException:
            await self.kill()
            raise
        if not ready:
            code = await process.wait()
            self.process = None
            raise SolverUnavailableError(f"graph solver process failed to start (exit code {code})")
        return process

    async def solve(self, text: str, timeout_s: float) -> str:
        process = await self.ensure_started()
        try:
            line = await asyncio.wait_for(self._exchange(process, text), timeout_s)
        except asyncio.TimeoutError:
            await self.kill()
            raise GraphTimeoutError(
                f"graph prompt not solved within the {timeout_s:g} s limit; ask for fewer paths "
                "or send a smaller graph"
            ) from None
        except ConnectionError:
            line = b""
        except BaseException:
            # Cancelled (or failed) mid-exchange: the process may still answer later, so it
            # cannot serve the next prompt.
            await self.kill()
            raise
        if not line:
            code = await process.wait()
            raise SolverUnavailableError(f"graph solver process exited (code {code}) while solving")
        reply = json.loads(line)
        if "answer" in reply:
            return reply["answer"]
        error = _ERRORS.get(reply["kind"])
        if error is None:
            raise SolverUnavailableError(f"graph solver failed: {reply['error']}")
        raise error(reply["error"])

    @staticmethod
    async def _exchange(process: asyncio.subprocess.Process, text: str) -> bytes:
        process.stdin.write(json.dumps({"text": text}).encode() + b"\n")
        await process.stdin.drain()
        return await process.stdout.readline()

    async def kill(self) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        # Reaping cannot be cancelled half-way, or the process would stay a zombie.
        await asyncio.shield(process.wait())

    async def close(self) -> None:
        """End the process: EOF on its stdin lets an idle worker exit on its own."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 2.0)
        except asyncio.TimeoutError:
            await self.kill()


class GraphSolverPool:
    """`await pool.solve(text)`: the ``submit_paths(...)`` answer of a graph prompt.

    Raises :class:`GraphError` (or :class:`GraphLimitError`) for a prompt that cannot
    be parsed or is over the size limits; :class:`GraphTimeoutError`
    (a GraphLimitError) when solving takes longer than ``timeout_s``;
    :class:`SolverBusyError` when ``workers`` solves run and ``max_waiting`` wait; and
    :class:`SolverUnavailableError` after close() or when a worker dies. The first three
    are ValueErrors: a bad prompt. The last two are RuntimeErrors: the server's state.
    """

    def __init__(
        self,
        workers: int = 2,
        timeout_s: float = 2.0,
        max_waiting: int = 64,
        python: str | None = None,
        start_timeout_s: float = 60.0,
    ) -> None:
        if workers < 1 or timeout_s <= 0 or max_waiting < 0:
            raise ValueError("graph solver pool needs workers >= 1, timeout_s > 0 and max_waiting >= 0")
        self.timeout_s = timeout_s
        self.max_waiting = max_waiting
        self._workers = [_Worker(python or sys.executable, start_timeout_s) for _ in range(workers)]
        self._free: asyncio.Queue[_Worker] = asyncio.Queue()
        for worker in self._workers:
            self._free.put_nowait(worker)
        self._waiting = 0
        self._closed = False

    @property
    def busy(self) -> int:
        """Workers solving a prompt now."""
        return len(self._workers) - self._free.qsize()

    @property
    def waiting(self) -> int:
        """Callers waiting for a free worker."""
        return self._waiting

    @property
    def restarts(self) -> int:
        """Worker processes replaced after a timeout, a cancellation or a crash."""
        return sum(worker.restarts for worker in self._workers)

    async def start(self) -> None:
        """Start every worker now, so the first prompts do not wait for interpreter start-up."""
        await asyncio.gather(*(worker.ensure_started() for worker in self._workers))

    async def solve(self, text: str) -> str:
        if self._closed:
            raise SolverUnavailableError("graph solver is shut down")
        if self._free.empty() and self._waiting >= self.max_waiting:
            raise SolverBusyError(
                f"graph solver busy: {len(self._workers)} prompts solving and {self._waiting} waiting"
            )
        self._waiting += 1
        try:
            worker = await self._free.get()
        finally:
            self._waiting -= 1
        try:
            if self._closed:
                raise SolverUnavailableError("graph solver is shut down")
            return await worker.solve(text, self.timeout_s)
        finally:
            self._free.put_nowait(worker)

    async def close(self) -> None:
        """Refuse new prompts and end every worker process."""
        self._closed = True
        await asyncio.gather(*(worker.close() for worker in self._workers))

    async def __aenter__(self) -> GraphSolverPool:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()
