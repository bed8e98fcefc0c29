"""What the scheduler and a model instance say to each other, as typed messages.

The connection an instance keeps to the scheduler *is* its address: the scheduler
sends a row to exactly the instance it chose, and a closed connection (the instance
process died, even by `kill -9`) is seen at once. Triton's BLS cannot offer either:
a call goes to a model name and Triton picks the instance.

- instance → scheduler: `Hello` (name, process id, device, load), `Step` (rows that
  got their first token, streamed text, load), `Done` (one row's outcome, load);
- scheduler → instance: `Run` (rows to start), `Cancel` (row ids).

Each message has one encoding (`to_wire`) and one decoding (`from_wire`); `encode`
and `decode` frame them (`specbatch.serving.framing`). Direct calls within one
process (`specbatch.serving.instance.direct`) pass the objects themselves.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from specbatch import acceptance
from specbatch.scheduling.load import BatchStepTotals, InstanceLoad
from specbatch.serving.framing import FrameError, pack

GENERATE, SCORE = "generate", "score"  # the two kinds of row an instance runs


class MessageError(FrameError):
    """A well-formed frame that is not a message of this protocol."""


@dataclass(frozen=True)
class RowWork:
    """One row the scheduler starts on an instance: a generation, or a prefill-only scoring.

    ``prompt`` is the exact text the model continues (a chat prompt arrives rendered);
    ``seconds_left`` is the client's deadline, relative to sending.
    """

    row: int
    kind: str
    prompt: str
    mode: str = "speculative"
    max_tokens: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    random_seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    stream: bool = False
    choices: tuple[str, ...] = ()
    seconds_left: float | None = None
    include_stop_str_in_output: bool = False

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> RowWork:
        values = _known(cls, data)
        values["stop"] = tuple(values.get("stop", ()))
        values["stop_token_ids"] = tuple(values.get("stop_token_ids", ()))
        values["logit_bias"] = tuple((int(t), float(v)) for t, v in values.get("logit_bias", ()))
        values["choices"] = tuple(values.get("choices", ()))
        return cls(**values)


@dataclass(frozen=True)
class RowOutcome:
    """The answer to one prompt, in the shape of the ensemble's outputs."""

    text: str = ""
    task: str = ""
    finish_reason: str = "stop"
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0
    error: str = ""
    instance: str = ""
    logprobs: str = ""  # the JSON of specbatch.logprobs.to_json, when the prompt asked

    @property
    def acceptance_rate(self) -> float:
        return acceptance.acceptance_rate(self.total_draft_tokens, self.total_accepted_draft_tokens)

    @property
    def cut_short(self) -> bool:
        """The row stopped before its end (its max_tokens, a deadline, a cancellation):
        its length is at least the tokens it made."""
        return self.finish_reason in ("length", "deadline", "cancelled")

    @classmethod
    def failed(cls, message: str, task: str = "", reason: str = "error") -> RowOutcome:
        return cls(task=task, finish_reason=reason, error=message)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> RowOutcome:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class Hello:
    """The first message of every connection: who the instance is and what it can hold."""

    TYPE: ClassVar[str] = "hello"
    instance: str
    load: InstanceLoad
    pid: int | None = None
    device: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "instance": self.instance,
            "pid": self.pid,
            "device": self.device,
            "load": asdict(self.load),
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Hello:
        instance, pid = data.get("instance"), data.get("pid")
        if not isinstance(instance, str):
            raise MessageError("a hello names its instance")
        return cls(
            instance,
            _load(data.get("load", {})),
            pid if isinstance(pid, int) else None,
            str(data.get("device", "")),
        )


@dataclass(frozen=True)
class Run:
    """Rows the scheduler admitted to this instance: start them now."""

    TYPE: ClassVar[str] = "run"
    rows: tuple[RowWork, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.TYPE, "rows": [work.to_wire() for work in self.rows]}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Run:
        return cls(tuple(RowWork.from_wire(row) for row in data["rows"]))


@dataclass(frozen=True)
class Cancel:
    """Rows nobody waits for any more: drop them at the next step."""

    TYPE: ClassVar[str] = "cancel"
    rows: tuple[int, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.TYPE, "rows": list(self.rows)}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Cancel:
        return cls(tuple(int(row) for row in data["rows"]))


@dataclass(frozen=True)
class Step:
    """An engine step: rows that produced their first token, streamed text, the fresh load.

    A delta is (row, text, the JSON log-probabilities of the tokens it completes; "" for
    a row that reports none)."""

    TYPE: ClassVar[str] = "step"
    first: tuple[int, ...]
    deltas: tuple[tuple[int, str, str], ...]
    load: InstanceLoad

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "first": list(self.first),
            "deltas": [list(d) for d in self.deltas],
            "load": asdict(self.load),
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Step:
        return cls(
            tuple(int(row) for row in data["first"]),
            tuple((int(row), str(text), str(logprobs)) for row, text, logprobs in data["deltas"]),
            _load(data["load"]),
        )


@dataclass(frozen=True)
class Done:
    """One row's end: its outcome, and the load with its memory released."""

    TYPE: ClassVar[str] = "done"
    row: int
    outcome: RowOutcome
    load: InstanceLoad

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "row": self.row,
            "outcome": self.outcome.to_wire(),
            "load": asdict(self.load),
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Done:
        return cls(int(data["row"]), RowOutcome.from_wire(data["outcome"]), _load(data["load"]))


Message = Hello | Run | Cancel | Step | Done
_MESSAGE_TYPES: dict[str, type[Message]] = {kind.TYPE: kind for kind in (Hello, Run, Cancel, Step, Done)}


def encode(message: Message) -> bytes:
    """The framed bytes of one message."""
    return pack(message.to_wire())


def decode(data: dict[str, Any]) -> Message:
    """The message a frame's object holds; MessageError for an unknown type or a bad field."""
    kind = _MESSAGE_TYPES.get(data["type"])
    if kind is None:
        raise MessageError(f"unknown message type {data['type']!r}")
    try:
        return kind.from_wire(data)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a field of the wrong shape
        raise MessageError(f"malformed {data['type']} message: {exc!r}") from None


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``cls`` present in ``data`` (a newer peer may send more)."""
    names = {f.name for f in fields(cls)}
    return {key: value for key, value in data.items() if key in names}


def _load(data: dict[str, Any]) -> InstanceLoad:
    values = _known(InstanceLoad, data)
    for name in ("lookahead_steps", "tokens_per_row_step"):
        values[name] = tuple(int(n) for n in values.get(name, ()))
    batch = _known(BatchStepTotals, values.get("batch_steps", {}))
    values["batch_steps"] = BatchStepTotals(
        **{k: tuple((float if "seconds" in k else int)(n) for n in v) for k, v in batch.items()}
    )
    return InstanceLoad(**values)
