"""The instance's long-lived connection to the scheduler (see `specbatch.serving.messages`).

A daemon thread connects (retrying until the scheduler has loaded), introduces the
instance, then reads the scheduler's messages for as long as the server runs. If the
scheduler goes away its rows are cancelled — nobody is waiting for them — and the
thread connects again. Writes come from the engine's loop thread and the reader;
one lock keeps frames whole.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from specbatch.serving.framing import FrameError, read_frame
from specbatch.serving.messages import Hello, Message, decode, encode

logger = logging.getLogger(__name__)

RETRY_S = 0.2


class SchedulerLink:
    """Connect to ``path``; ``hello()`` is the first message of every connection and
    ``on_message`` receives the scheduler's; ``on_lost`` runs when a connection ends."""

    def __init__(
        self,
        path: Path,
        hello: Callable[[], Hello],
        on_message: Callable[[Message], None],
        on_lost: Callable[[], None],
    ) -> None:
        self._path = path
        self._hello = hello
        self._on_message = on_message
        self._on_lost = on_lost
        self._sock: socket.socket | None = None
        self._write_lock = threading.Lock()
        self._stopping = threading.Event()
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specbatch-link", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        sock = self._sock
        if sock is not None:
            sock.close()

    def send(self, message: Message) -> None:
        """Send one message; dropped (with a log line) while disconnected — the scheduler
        has then already settled this instance's rows."""
        frame = encode(message)
        with self._write_lock:
            sock = self._sock
            if sock is None:
                logger.debug("not connected: %s message dropped", message.TYPE)
                return
            try:
                sock.sendall(frame)
            except OSError:
                logger.warning("sending to the scheduler failed; reconnecting")
                sock.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            sock = self._connect()
            if sock is None:
                return
            try:
                with self._write_lock:
                    self._sock = sock
                    sock.sendall(encode(self._hello()))
                self.connected.set()
                logger.info("connected to the scheduler at %s", self._path)
                while (data := read_frame(sock)) is not None:
                    self._dispatch(data)
            except (OSError, FrameError) as exc:
                if not self._stopping.is_set():
                    logger.warning("scheduler connection lost: %s", exc)
            finally:
                self.connected.clear()
                with self._write_lock:
                    self._sock = None
                sock.close()
            self._on_lost()

    def _dispatch(self, data: dict) -> None:
        try:
            self._on_message(decode(data))
        except Exception:  # one bad message loses itself, not the connection
            logger.exception("handling a %r message failed", data.get("type"))

    def _connect(self) -> socket.socket | None:
        while not self._stopping.is_set():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(self._path))
                return sock
            except OSError:
                sock.close()
                self._stopping.wait(RETRY_S)
        return None
