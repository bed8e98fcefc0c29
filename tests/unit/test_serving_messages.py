"""What crosses the socket between the scheduler and the instances: every message kind,
rows and outcomes round-trip exactly, and framing survives split reads and refuses garbage."""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import threading
from dataclasses import asdict

import numpy as np
import pytest

from specbatch.scheduling.load import BatchStepTotals, InstanceLoad
from specbatch.serving import framing
from specbatch.serving.framing import HEADER, FrameError, pack, read_frame, unpack
from specbatch.serving.messages import (
    GENERATE,
    SCORE,
    Cancel,
    Done,
    Hello,
    Message,
    MessageError,
    RowOutcome,
    RowWork,
    Run,
    Step,
    decode,
    encode,
)
from specbatch.triton.strings import strings, texts

LOAD = InstanceLoad(
    running=3,
    waiting=1,
    blocks_total=256,
    blocks_free=200,
    block_size=16,
    step_seconds=0.05,
    seconds_per_token=0.25,
    lookahead=2,
    lookahead_steps=(5, 0, 7),
    tokens_per_row_step=(0, 9, 4, 3),
    batch_steps=BatchStepTotals(
        (4, 2),
        (4, 5),
        (7, 9),
        (30, 0),
        (0.25, 0.125),
        (3, 2),
        (0.125, 0.125),
        (0.0078125, 0.0078125),
        (400, 900),
    ),
    preemptions=1,
    max_rows=8,
)
# A chat prompt travels rendered: the exact text the model continues.
CHAT_PROMPT = (
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\né<|im_end|>\n"
    "<|im_start|>assistant\nok<|im_end|>\n<|im_start|>user\nWhich?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is ("
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
        include_stop_str_in_output=True,
    ),
    RowWork(row=5, kind=SCORE, prompt="Question: x\nAnswer:", choices=(" A", " B")),
    RowWork(row=6, kind=SCORE, prompt=CHAT_PROMPT, choices=("A", "B")),
    RowWork(row=7, kind=GENERATE, prompt="route me", mode="draft_only", max_tokens=4),
]
OUTCOMES = [
    RowOutcome("ünïcode", "infobench", "length", 5, 8, 10, 7, instance="specdec_0"),
    RowOutcome.failed("prompt is empty", task="mmlu"),
]


def across(message: Message) -> Message:
    """The message as the other end reads it."""
    frame = encode(message)
    (length,) = struct.unpack(">I", frame[:4])
    assert HEADER.size == 4 and length == len(frame) - 4
    return decode(unpack(frame[4:]))


def plain(data: dict) -> dict:
    """``data`` in JSON's own types (tuples become lists)."""
    return json.loads(json.dumps(data))


MESSAGES: dict[str, Message] = {
    "hello": Hello(instance="specdec_0", load=LOAD, pid=4242, device="cuda:0"),
    "step": Step(first=(4, 6), deltas=((4, "Grüße ", ""), (6, "🙂", "[{\"id\":5}]")), load=LOAD),
    "done": Done(row=4, outcome=OUTCOMES[0], load=LOAD),
    "run": Run(tuple(ROWS)),
    "cancel": Cancel((4, 5)),
}


@pytest.mark.parametrize("kind", sorted(MESSAGES))
def test_every_message_kind_round_trips(kind):
    message = MESSAGES[kind]
    assert kind == message.TYPE
    assert across(message) == message
    assert unpack(encode(message)[4:]) == plain(message.to_wire())
    assert message.to_wire()["type"] == kind


def test_rows_round_trip_with_sampling_stops_choices_and_rendered_chat():
    back = across(MESSAGES["run"]).rows
    assert back == tuple(ROWS)
    assert isinstance(back[0].stop, tuple) and isinstance(back[1].choices, tuple)
    assert back[2].prompt == CHAT_PROMPT, "a chat prompt arrives as the exact text the model continues"
    assert "chat" not in ROWS[0].to_wire(), "a row carries no chat format: its prompt is rendered"


def test_a_row_from_a_newer_scheduler_keeps_what_this_instance_knows():
    data = {**ROWS[1].to_wire(), "priority": 3}
    assert RowWork.from_wire(data) == ROWS[1]
    assert RowWork.from_wire({"row": 1, "kind": GENERATE, "prompt": "p"}) == RowWork(1, GENERATE, "p")


def test_outcomes_and_loads_round_trip_with_counters_and_rate():
    assert [across(Done(row, o, LOAD)).outcome for row, o in enumerate(OUTCOMES)] == OUTCOMES
    assert [RowOutcome.from_wire(plain(o.to_wire())) for o in OUTCOMES] == OUTCOMES
    assert OUTCOMES[0].acceptance_rate == pytest.approx(0.7) and OUTCOMES[1].acceptance_rate == 0.0
    assert (OUTCOMES[1].finish_reason, OUTCOMES[1].task, OUTCOMES[1].text) == ("error", "mmlu", "")
    assert across(MESSAGES["hello"]).load == LOAD
    newer = {"type": "hello", "instance": "i", "load": {"running": 2, "from_the_future": 1}}
    assert decode(newer).load == InstanceLoad(running=2)
    assert (LOAD.free_tokens, LOAD.total_tokens, LOAD.held_tokens) == (3200, 4096, 896)


def test_a_hello_without_a_pid_or_device_still_names_its_instance():
    hello = decode({"type": "hello", "instance": "specdec_1", "load": asdict(LOAD)})
    assert hello == Hello(instance="specdec_1", load=LOAD, pid=None, device="")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"type": "reboot"}, "unknown message type 'reboot'"),
        ({"type": "hello", "load": {}}, "names its instance"),
        ({"type": "cancel"}, "malformed cancel"),
        ({"type": "cancel", "rows": ["x"]}, "malformed cancel"),
        ({"type": "run", "rows": [{"row": 1}]}, "malformed run"),
        ({"type": "step", "first": [], "deltas": [[1]], "load": {}}, "malformed step"),
        ({"type": "done", "row": 1, "outcome": {}}, "malformed done"),
        ({"type": "step", "first": [], "deltas": [], "load": []}, "malformed step"),
        ({"type": "step", "first": [], "deltas": [], "load": {"batch_steps": [1]}}, "malformed step"),
    ],
)
def test_frames_that_are_no_message_of_the_protocol_are_message_errors(data, message):
    with pytest.raises(MessageError, match=message) as raised:
        decode(data)
    assert isinstance(raised.value, FrameError)


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


def test_read_frame_reads_frames_back_to_back_and_none_at_the_end(sockets):
    writer, reader = sockets
    writer.sendall(encode(MESSAGES["step"]) + encode(MESSAGES["cancel"]))
    writer.shutdown(socket.SHUT_WR)
    assert decode(read_frame(reader)) == MESSAGES["step"]
    assert decode(read_frame(reader)) == MESSAGES["cancel"]
    assert read_frame(reader) is None


def test_a_frame_split_across_sends_is_read_whole(sockets):
    writer, reader = sockets
    frame = encode(MESSAGES["run"])
    pieces = [frame[:2], frame[2:7], frame[7:-1], frame[-1:]]
    received: list = []
    finished = threading.Event()

    def read():
        received.append(read_frame(reader))
        finished.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    for piece in pieces:
        writer.sendall(piece)
    assert finished.wait(30)
    assert received == [plain(MESSAGES["run"].to_wire())]
    assert decode(received[0]) == MESSAGES["run"]


class Trickle:
    """A socket whose every recv returns at most one byte: every read is a partial one."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def recv(self, count: int) -> bytes:
        chunk, self._data = self._data[:1], self._data[1:]
        return chunk


def test_one_byte_at_a_time_still_makes_whole_messages():
    source = Trickle(encode(MESSAGES["done"]) + encode(MESSAGES["hello"]))
    assert decode(read_frame(source)) == MESSAGES["done"]
    assert decode(read_frame(source)) == MESSAGES["hello"]
    assert read_frame(source) is None


def test_a_stream_that_ends_inside_a_frame_is_an_error():
    frame = encode(MESSAGES["cancel"])
    with pytest.raises(FrameError, match="inside a frame"):
        read_frame(Trickle(frame[:2]))
    with pytest.raises(FrameError, match="inside a frame"):
        read_frame(Trickle(frame[:-3]))


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
def test_garbage_frames_are_frame_errors(sockets, body, message):
    writer, reader = sockets
    writer.sendall(struct.pack(">I", len(body)) + body)
    with pytest.raises(FrameError, match=message):
        read_frame(reader)


def test_an_oversized_frame_is_refused_before_it_is_read(sockets):
    writer, reader = sockets
    writer.sendall(struct.pack(">I", framing.MAX_FRAME_BYTES + 1))
    with pytest.raises(FrameError, match="exceeds"):
        read_frame(reader)


def test_an_oversized_message_is_refused_when_encoded(monkeypatch):
    monkeypatch.setattr(framing, "MAX_FRAME_BYTES", 64)
    encode(Cancel((1,)))
    with pytest.raises(FrameError, match="exceeds 64"):
        encode(Run((ROWS[0],)))
    with pytest.raises(FrameError, match="exceeds 64"):
        pack({"type": "x", "padding": "y" * 64})


def test_the_socket_lives_in_a_private_directory_per_server(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    path = framing.socket_path(4242)
    assert path == tmp_path / "specbatch-4242" / "instances.sock"
    assert framing.socket_path() == tmp_path / f"specbatch-{os.getppid()}" / "instances.sock"
    framing.prepare_socket_dir(path)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    path.write_text("stale")
    framing.prepare_socket_dir(path)
    assert not path.exists()
