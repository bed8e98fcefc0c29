"""The scheduler's end of the instance connections: a Unix socket server on its loop.

Each connection must open with a ``hello`` naming the instance; after that its
messages go to the core, and the core's messages for that instance go out on it.
End of stream — a clean close or a process killed outright — takes the instance out
of service at once. The hello carries the instance's process id, so that a hung
instance can be ended (and then restarted by whoever supervises the server).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

from specbatch.serving.framing import HEADER, FrameError, body_length, prepare_socket_dir, unpack
from specbatch.serving.messages import Done, Hello, Message, Step, decode, encode
from specbatch.serving.scheduler.core import SchedulerCore

logger = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0


class _Channel:
    """One instance's connection, as the core sends on it."""

    def __init__(self, writer: asyncio.StreamWriter, pid: int | None) -> None:
        self._writer = writer
        self._pid = pid

    def send(self, message: Message) -> None:
        if not self._writer.is_closing():
            self._writer.write(encode(message))

    def terminate(self) -> None:
        self._writer.close()
        if self._pid is not None and self._pid != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)


class InstanceHub:
    """Accepts instance connections at ``path`` and feeds the core."""

    def __init__(self, core: SchedulerCore, path: Path) -> None:
        self._core = core
        self._path = path
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task] = set()

    async def start(self) -> None:
        prepare_socket_dir(self._path)
        self._server = await asyncio.start_unix_server(self._serve, path=str(self._path))
        self._path.chmod(0o600)
        logger.info("waiting for model instances at %s", self._path)

    async def stop(self) -> None:
        """Stop accepting, then end every connection (its rows are settled by then)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        self._path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        channel, name = None, None
        try:
            hello = await asyncio.wait_for(_read(reader), HELLO_TIMEOUT_S)
            if hello is None or hello.get("type") != Hello.TYPE:
                raise FrameError("the first message must be a hello naming the instance")
            introduced = Hello.from_wire(hello)
            name = introduced.instance
            channel = _Channel(writer, introduced.pid)
            self._core.instance_joined(name, introduced.load, channel)
            while (data := await _read(reader)) is not None:
                self._dispatch(channel, name, data)
            reason = "its connection closed"
        except (OSError, FrameError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
            reason = f"its connection failed: {exc}"
        except asyncio.CancelledError:
            reason = "the scheduler is stopping"
        except Exception as exc:  # whatever broke, the instance's rows must still be settled
            logger.exception("serving the connection of instance %s failed", name)
            reason = f"its connection failed: {exc}"
        finally:
            writer.close()
            self._connections.discard(task)
        if channel is not None:
            self._core.instance_lost(channel, reason)

    def _dispatch(self, channel: _Channel, name: str, data: dict) -> None:
        try:
            message = decode(data)
            if isinstance(message, Step):
                self._core.instance_step(channel, message.first, message.deltas, message.load)
            elif isinstance(message, Done):
                self._core.instance_done(channel, message.row, message.outcome, message.load)
            else:
                logger.warning("instance %s sent an unexpected %s message", name, data["type"])
        except Exception:  # one bad message loses itself, not the instance
            logger.exception("handling %r from instance %s failed", data["type"], name)


async def _read(reader: asyncio.StreamReader) -> dict | None:
    """One frame's object; None at a clean end of stream."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    return unpack(await reader.readexactly(body_length(header)))
