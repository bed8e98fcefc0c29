"""What crosses the socket between the scheduler and the instances: every message kind,
rows and outcomes round-trip exactly, and framing survives split reads and refuses garbage."""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import threading

import numpy as np
import pytest

from specbatch.scheduling.load import InstanceLoad
from specbatch.serving import wire
from specbatch.serving.chat import ChatFormat
from specbatch.serving.wire import (
    GENERATE,
    SCORE,
    RowOutcome,
    RowWork,
    WireError,
    decode,
    encode,
    load_from_dict,
    load_to_dict,
    outcome_from_dict,
    outcome_to_dict,
    read_message,
    strings,
    texts,
    work_from_dict,
    work_to_dict,
)

LOAD = InstanceLoad(
    running=3,
    waiting=1,
    blocks_total=256,
    blocks_free=200,
    block_size=16,
    step_seconds=0.05,
    seconds_per_token=0.25,
    lookahead=2,
    preemptions=1,
    max_rows=8,
)
ROWS = [
    RowWork(
        row=4,
        kind=GENERATE,
        prompt="Instruction: héllo 🙂\nGeneration:",
        mode="target_only",
        max_tokens=16,
        temperature=0.75,
        top_p=0.5,
        top_k=40,
        stop=("\n\n", "END"),
        stream=True,
        seconds_left=1.5,
    ),
    RowWork(row=5, kind=SCORE, prompt="Question: x\nAnswer:", choices=(" A", " B")),
    RowWork(
        row=6,
        kind=SCORE,
        prompt="Which?",
        chat=ChatFormat(
            history=(("system", "Be brief."), ("user", "é"), ("assistant", "ok")),
            enable_thinking=True,
            assistant_prefix="The answer is (",
        ),
        choices=("A", "B"),
    ),
    RowWork(row=7, kind=GENERATE, prompt="route me", mode="draft_only", max_tokens=4),
]
OUTCOMES = [
    RowOutcome("ünïcode", "infobench", "length", 5, 8, 10, 7, instance="specdec_0"),
    RowOutcome.failed("prompt is empty", task="mmlu"),
]


def across(message: dict) -> dict:
    """The message as the other end reads it."""
    frame = encode(message)
    (length,) = struct.unpack(">I", frame[:4])
    assert length == len(frame) - 4
    return decode(frame[4:])


def plain(message: dict) -> dict:
    """``message`` in JSON's own types (tuples become lists)."""
    return json.loads(json.dumps(message))


MESSAGES = {
    "hello": {"type": "hello", "instance": "specdec_0", "device": "cuda:0", "load": load_to_dict(LOAD)},
    "step": {
        "type": "step",
        "first": [4, 6],
        "deltas": [[4, "Grüße "], [6, "🙂"]],
        "load": load_to_dict(LOAD),
    },
    "done": {"type": "done", "row": 4, "outcome": outcome_to_dict(OUTCOMES[0]), "load": load_to_dict(LOAD)},
    "run": {"type": "run", "rows": [work_to_dict(row) for row in ROWS]},
    "cancel": {"type": "cancel", "rows": [4, 5]},
}


@pytest.mark.parametrize("kind", sorted(MESSAGES))
def test_every_message_kind_round_trips(kind):
    assert across(MESSAGES[kind]) == plain(MESSAGES[kind])


def test_rows_round_trip_with_sampling_stops_choices_and_chat():
    back = [work_from_dict(data) for data in across(MESSAGES["run"])["rows"]]
    assert back == ROWS
    assert back[2].chat == ROWS[2].chat and isinstance(back[2].chat.history[0], tuple)
    assert work_to_dict(ROWS[0])["chat"] is None, "a raw row carries no chat format"


def test_a_row_from_a_newer_scheduler_keeps_what_this_instance_knows():
    data = {**work_to_dict(ROWS[1]), "priority": 3}
    assert work_from_dict(data) == ROWS[1]
    assert work_from_dict({"row": 1, "kind": GENERATE, "prompt": "p"}) == RowWork(1, GENERATE, "p")


def test_outcomes_and_loads_round_trip_with_counters_and_rate():
    assert [
        outcome_from_dict(across({"type": "x", "o": outcome_to_dict(o)})["o"]) for o in OUTCOMES
    ] == OUTCOMES
    assert OUTCOMES[0].acceptance_rate == pytest.approx(0.7) and OUTCOMES[1].acceptance_rate == 0.0
    assert (OUTCOMES[1].finish_reason, OUTCOMES[1].task, OUTCOMES[1].text) == ("error", "mmlu", "")
    assert load_from_dict(across(MESSAGES["hello"])["load"]) == LOAD
    assert load_from_dict({"running": 2, "from_the_future": 1}) == InstanceLoad(running=2)
    assert (LOAD.free_tokens, LOAD.total_tokens, LOAD.held_tokens) == (3200, 4096, 896)


def test_string_tensors_round_trip_and_bad_bytes_are_replaced():
    values = ["plain", "héllo 🙂", ""]
    array = strings(values)
    assert array.dtype == np.object_ and array.tolist() == [v.encode() for v in values]
    assert texts(array) == values
    assert texts(np.array([[b"ok \xff"], ["str"]], dtype=np.object_)) == ["ok \ufffd", "str"]


@pytest.fixture
def sockets():
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield left, right
    left.close()
    right.close()


def test_read_message_reads_frames_back_to_back_and_none_at_the_end(sockets):
    writer, reader = sockets
    writer.sendall(encode(MESSAGES["step"]) + encode(MESSAGES["cancel"]))
    writer.shutdown(socket.SHUT_WR)
    assert read_message(reader) == MESSAGES["step"]
    assert read_message(reader) == MESSAGES["cancel"]
    assert read_message(reader) is None


def test_a_frame_split_across_sends_is_read_whole(sockets):
    writer, reader = sockets
    frame = encode(MESSAGES["run"])
    pieces = [frame[:2], frame[2:7], frame[7:-1], frame[-1:]]
    received: list = []
    finished = threading.Event()

    def read():
        received.append(read_message(reader))
        finished.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    for piece in pieces:
        writer.sendall(piece)
    assert finished.wait(30)
    assert received == [plain(MESSAGES["run"])]


class Trickle:
    """A socket whose every recv returns at most one byte: every read is a partial one."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def recv(self, count: int) -> bytes:
        chunk, self._data = self._data[:1], self._data[1:]
        return chunk


def test_one_byte_at_a_time_still_makes_whole_messages():
    source = Trickle(encode(MESSAGES["done"]) + encode(MESSAGES["hello"]))
    assert read_message(source) == MESSAGES["done"]
    assert read_message(source) == MESSAGES["hello"]
    assert read_message(source) is None


def test_a_stream_that_ends_inside_a_frame_is_an_error():
    frame = encode(MESSAGES["cancel"])
    with pytest.raises(WireError, match="inside a frame"):
        read_message(Trickle(frame[:2]))
    with pytest.raises(WireError, match="inside a frame"):
        read_message(Trickle(frame[:-3]))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\xff\xfe garbage", "not a JSON message"),
        (b"{not json", "not a JSON message"),
        (b"[1, 2]", "JSON object with a string 'type'"),
        (b'{"rows": []}', "JSON object with a string 'type'"),
        (b'{"type": 3}', "JSON object with a string 'type'"),
    ],
)
def test_garbage_frames_are_wire_errors(sockets, body, message):
    writer, reader = sockets
    writer.sendall(struct.pack(">I", len(body)) + body)
    with pytest.raises(WireError, match=message):
        read_message(reader)


def test_an_oversized_frame_is_refused_before_it_is_read(sockets):
    writer, reader = sockets
    writer.sendall(struct.pack(">I", wire.MAX_FRAME_BYTES + 1))
    with pytest.raises(WireError, match="exceeds"):
        read_message(reader)


def test_an_oversized_message_is_refused_when_encoded(monkeypatch):
    monkeypatch.setattr(wire, "MAX_FRAME_BYTES", 64)
    encode({"type": "cancel", "rows": [1]})
    with pytest.raises(WireError, match="exceeds 64"):
        encode({"type": "run", "rows": [work_to_dict(ROWS[0])]})


def test_the_socket_lives_in_a_private_directory_per_server(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    path = wire.socket_path(4242)
    assert path == tmp_path / "specbatch-4242" / "instances.sock"
    assert wire.socket_path() == tmp_path / f"specbatch-{os.getppid()}" / "instances.sock"
    wire.prepare_socket_dir(path)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    path.write_text("stale")
    wire.prepare_socket_dir(path)
    assert not path.exists()
