"""Length-prefixed JSON frames on the scheduler's Unix socket, and where that socket lives.

Every qwen3_specdec instance connects to the scheduler over a Unix socket private to
its tritonserver (a directory named after the server's process id, mode 0700) and
keeps that connection for its lifetime. This module only moves frames: a 4-byte
big-endian length, then a JSON object. What the objects mean is
`specbatch.serving.messages`.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import tempfile
from pathlib import Path
from typing import Any

MAX_FRAME_BYTES = 64 << 20
HEADER = struct.Struct(">I")


class FrameError(RuntimeError):
    """Bytes that are not a frame of this protocol, or a connection that broke inside one."""


def socket_path(server_pid: int | None = None) -> Path:
    """The scheduler's socket for the tritonserver whose stubs we are (their parent process)."""
    pid = os.getppid() if server_pid is None else server_pid
    return Path(tempfile.gettempdir()) / f"specbatch-{pid}" / "instances.sock"


def prepare_socket_dir(path: Path) -> None:
    """Create the socket's directory readable by this user only; remove a stale socket."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    if path.exists():
        path.unlink()


def pack(data: dict[str, Any]) -> bytes:
    """One frame holding ``data``."""
    body = json.dumps(data, separators=(",", ":")).encode("utf-8")
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(f"message of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return HEADER.pack(len(body)) + body


def body_length(header: bytes) -> int:
    """The length a frame's header announces, refused when over the limit."""
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
    return length


def unpack(body: bytes) -> dict[str, Any]:
    """A frame's body as the JSON object it must be, with a string ``type``."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FrameError(f"not a JSON message: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise FrameError("a message is a JSON object with a string 'type'")
    return data


def read_frame(sock: socket.socket) -> dict[str, Any] | None:
    """One frame's object from a blocking socket; None at a clean end of stream."""
    header = _read_exactly(sock, HEADER.size)
    if header is None:
        return None
    body = _read_exactly(sock, body_length(header))
    if body is None:
        raise FrameError("connection closed inside a frame")
    return unpack(body)


def _read_exactly(sock: socket.socket, count: int) -> bytes | None:
    chunks, remaining = [], count
    while remaining:
        chunk = sock.recv(remaining)
        if not chunk:
            if remaining == count:
                return None
            raise FrameError("connection closed inside a frame")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)
