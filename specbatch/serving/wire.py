"""What travels between the scheduler and the model instances, defined once, torch-free.

Every qwen3_specdec instance connects to the scheduler over a Unix socket private to
its tritonserver (a directory named after the server's process id, mode 0700) and
keeps that connection for its lifetime. The connection *is* the instance's address:
the scheduler sends a row to exactly the instance it chose, and a closed connection
(the instance process died, even by `kill -9`) is seen at once. Triton's BLS cannot
offer either: a call goes to a model name and Triton picks the instance.

Messages are length-prefixed JSON objects with a ``type``:

- instance → scheduler: ``hello`` (name, device, load), ``step`` (load, rows that got
  their first token, streamed text deltas), ``done`` (one row's outcome, load);
- scheduler → instance: ``run`` (rows to start), ``cancel`` (row ids).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from specbatch.scheduling.load import InstanceLoad
from specbatch.serving.chat import ChatFormat

MAX_FRAME_BYTES = 64 << 20
_HEADER = struct.Struct(">I")

GENERATE, SCORE = "generate", "score"
AMBIGUOUS = "ambiguous"  # the router's task for a prompt only the draft model can place


class WireError(RuntimeError):
    """A frame that is not a message of this protocol."""


@dataclass(frozen=True)
class RowOutcome:
    """The answer to one prompt, in the shape of the ensemble's outputs (DESIGN §2)."""

    text: str = ""
    task: str = ""
    finish_reason: str = "stop"
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0
    error: str = ""
    instance: str = ""

    @property
    def acceptance_rate(self) -> float:
        if self.total_draft_tokens == 0:
            return 0.0
        return self.total_accepted_draft_tokens / self.total_draft_tokens

    @classmethod
    def failed(cls, message: str, task: str = "", reason: str = "error") -> RowOutcome:
        return cls(task=task, finish_reason=reason, error=message)


@dataclass(frozen=True)
class RowWork:
    """One row the scheduler starts on an instance: a generation, or a prefill-only scoring."""

    row: int
    kind: str
    prompt: str
    mode: str = "speculative"
    max_tokens: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    stream: bool = False
    chat: ChatFormat | None = None
    choices: tuple[str, ...] = ()
    seconds_left: float | None = None  # the client's deadline, relative to sending


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


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode("utf-8")
    if len(body) > MAX_FRAME_BYTES:
        raise WireError(f"message of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return _HEADER.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise WireError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
    return length


def decode(body: bytes) -> dict[str, Any]:
    try:
        message = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"not a JSON message: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise WireError("a message is a JSON object with a string 'type'")
    return message


def read_message(sock: socket.socket) -> dict[str, Any] | None:
    """One message from a blocking socket; None at end of stream."""
    header = _read_exactly(sock, _HEADER.size)
    if header is None:
        return None
    body = _read_exactly(sock, frame_length(header))
    if body is None:
        raise WireError("connection closed inside a frame")
    return decode(body)


def _read_exactly(sock: socket.socket, count: int) -> bytes | None:
    chunks, remaining = [], count
    while remaining:
        chunk = sock.recv(remaining)
        if not chunk:
            if remaining == count:
                return None
            raise WireError("connection closed inside a frame")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def work_to_dict(work: RowWork) -> dict[str, Any]:
    data = asdict(work)
    data["chat"] = None if work.chat is None else _chat_to_dict(work.chat)
    return data


def work_from_dict(data: dict[str, Any]) -> RowWork:
    known = {f.name for f in fields(RowWork)}
    values = {k: v for k, v in data.items() if k in known}
    values["stop"] = tuple(values.get("stop", ()))
    values["choices"] = tuple(values.get("choices", ()))
    chat = values.get("chat")
    values["chat"] = None if chat is None else _chat_from_dict(chat)
    return RowWork(**values)


def outcome_to_dict(outcome: RowOutcome) -> dict[str, Any]:
    return asdict(outcome)


def outcome_from_dict(data: dict[str, Any]) -> RowOutcome:
    known = {f.name for f in fields(RowOutcome)}
    return RowOutcome(**{k: v for k, v in data.items() if k in known})


def load_to_dict(load: InstanceLoad) -> dict[str, Any]:
    return asdict(load)


def load_from_dict(data: dict[str, Any]) -> InstanceLoad:
    known = {f.name for f in fields(InstanceLoad)}
    return InstanceLoad(**{k: v for k, v in data.items() if k in known})


def _chat_to_dict(chat: ChatFormat) -> dict[str, Any]:
    return {
        "history": [list(turn) for turn in chat.history],
        "enable_thinking": chat.enable_thinking,
        "assistant_prefix": chat.assistant_prefix,
    }


def _chat_from_dict(data: dict[str, Any]) -> ChatFormat:
    return ChatFormat(
        history=tuple((role, content) for role, content in data.get("history", ())),
        enable_thinking=bool(data.get("enable_thinking", False)),
        assistant_prefix=str(data.get("assistant_prefix", "")),
    )


def strings(values: Sequence[str]) -> np.ndarray:
    """A Triton STRING tensor (numpy object array of UTF-8 bytes)."""
    return np.array([v.encode("utf-8") for v in values], dtype=np.object_)


def texts(array: np.ndarray) -> list[str]:
    """A STRING tensor back to str, replacing undecodable bytes (callers validate prompts first)."""
    return [
        v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)
    ]
