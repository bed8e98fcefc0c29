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
from typing import Any

from specbatch.serving.scheduler.core import SchedulerCore
from specbatch.serving.wire import (
    WireError,
    decode,
    encode,
    frame_length,
    load_from_dict,
    outcome_from_dict,
    prepare_socket_dir,
)

logger = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0


class _Channel:
    """One instance's connection, as the core sends on it."""

    def __init__(self, writer: asyncio.StreamWriter, pid: int | None) -> None:
        self._writer = writer
        self._pid = pid

    def send(self, message: dict[str, Any]) -> None:
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
            if hello is None or hello.get("type") != "hello" or not isinstance(hello.get("instance"), str):
                raise WireError("the first message must be a hello naming the instance")
            name = hello["instance"]
            pid = hello.get("pid")
            channel = _Channel(writer, pid if isinstance(pid, int) else None)
            self._core.instance_joined(name, load_from_dict(hello.get("load", {})), channel)
            while (message := await _read(reader)) is not None:
                self._dispatch(channel, name, message)
            reason = "its connection closed"
        except (OSError, WireError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
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

    def _dispatch(self, channel: _Channel, name: str, message: dict[str, Any]) -> None:
        kind = message["type"]
        try:
            load = load_from_dict(message["load"])
            if kind == "step":
                self._core.instance_step(channel, message["first"], message["deltas"], load)
            elif kind == "done":
                self._core.instance_done(
                    channel, int(message["row"]), outcome_from_dict(message["outcome"]), load
                )
            else:
                logger.warning("instance %s sent an unknown message %r", name, kind)
        except Exception:  # one bad message loses itself, not the instance
            logger.exception("handling %r from instance %s failed", kind, name)


async def _read(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    try:
        header = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    return decode(await reader.readexactly(frame_length(header)))
