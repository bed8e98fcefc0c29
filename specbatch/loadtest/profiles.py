"""Load-test profiles: the workload to offer and the SLA it must meet, from one YAML file.

A profile is read and checked completely before anything starts (no server, no
Locust), so a typo in a key or a negative rate fails in a second with a message that
names the offending field, instead of after a server start and a long run.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specbatch.routing.classify import TASKS

CLIENTS = ("grpc_stream", "http")
ARRIVAL_SHAPES = ("constant", "poisson", "bursts")
PROFILE_ENV = "SPECBATCH_LOADTEST_PROFILE"

_TIMESPAN = re.compile(
    r"^(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m(?!s))?"
    r"(?:(?P<s>\d+(?:\.\d+)?)s)?(?:(?P<ms>\d+(?:\.\d+)?)ms)?$"
)


class ProfileError(ValueError):
    """The profile file is missing, unreadable, or a field in it is invalid."""


@dataclass(frozen=True)
class PromptSource:
    """Where prompts come from: the seeded generated workload, or a JSONL file of {"text", "task"}."""

    kind: str
    count: int = 200
    seed: int = 0
    path: Path | None = None


@dataclass(frozen=True)
class Arrival:
    """Offered load in requests/s over all users together.

    Bursts alternate `on_rate` for `on_s` seconds and `off_rate` for `off_s` seconds.
    """

    shape: str
    rate: float = 0.0
    on_rate: float = 0.0
    off_rate: float = 0.0
    on_s: float = 0.0
    off_s: float = 0.0


@dataclass(frozen=True)
class Workload:
    """What Locust offers: `users` split over `clients` by weight, tasks drawn by `mix`.

    `max_tokens` maps a task to an inclusive (low, high) range drawn per request (low ==
    high for a fixed cap); a task not in it gets the server's default. `ignore_eos` runs
    every generated answer to that cap through end-of-sequence tokens, so the load is the
    token counts the profile names, not wherever the model happens to stop.
    """

    users: int
    spawn_rate: float
    duration_s: float
    clients: dict[str, int]
    mix: dict[str, float]
    prompts: PromptSource
    max_tokens: dict[str, tuple[int, int]]
    arrival: Arrival
    request_timeout_s: float = 60.0
    stop_timeout_s: float = 30.0
    ignore_eos: bool = False

    @property
    def active_clients(self) -> list[str]:
        return [name for name in CLIENTS if self.clients.get(name, 0) > 0]

    @property
    def active_tasks(self) -> list[str]:
        return [task for task in TASKS if self.mix.get(task, 0) > 0]


@dataclass(frozen=True)
class TaskTargets:
    """Latency targets in milliseconds for one task; None leaves that figure unchecked."""

    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    e2e_p99_ms: float | None = None


@dataclass(frozen=True)
class SlaProfile:
    max_error_rate: float
    tasks: dict[str, TaskTargets] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadProfile:
    name: str
    path: Path
    workload: Workload
    sla: SlaProfile
    description: str = ""


def parse_timespan(value: object, where: str) -> float:
    """Seconds from a number or a span such as "20s", "1m30s", "1h", "500ms"."""
    if isinstance(value, bool):
        raise ProfileError(f"{where} must be a duration such as 20s or 1m30s, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip() and (match := _TIMESPAN.match(value.strip())):
        parts = {k: float(v) for k, v in match.groupdict().items() if v is not None}
        seconds = (
            parts.get("h", 0) * 3600 + parts.get("m", 0) * 60 + parts.get("s", 0) + parts.get("ms", 0) / 1000
        )
    else:
        raise ProfileError(f"{where} must be a duration such as 20s or 1m30s, got {value!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ProfileError(f"{where} must be a positive duration, got {value!r}")
    return seconds


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ProfileError(f"{where} must be a mapping, got {type(value).__name__}")
    return value


def _only_keys(section: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(section) - set(allowed))
    if unknown:
        raise ProfileError(
            f"{where}: unknown key(s) {', '.join(map(str, unknown))}; allowed: {', '.join(allowed)}"
        )


def _required(section: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in section:
        raise ProfileError(f"{where}.{key} is required")
    return section[key]


def _number(value: object, where: str, *, positive: bool = False, allow_zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProfileError(f"{where} must be a number, got {value!r}")
    if value < 0 or (value == 0 and (positive or not allow_zero)):
        kind = "positive" if positive else "non-negative"
        raise ProfileError(f"{where} must be {kind}, got {value!r}")
    return float(value)


def _integer(value: object, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ProfileError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return value


def _boolean(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ProfileError(f"{where} must be true or false, got {value!r}")
    return value


def _token_range(value: object, where: str) -> tuple[int, int]:
    """A fixed cap (`64`) or an inclusive range drawn per request (`[16, 128]`) for mixed lengths."""
    if isinstance(value, list):
        if len(value) != 2:
            raise ProfileError(f"{where} must be an integer or a [low, high] pair, got {value!r}")
        low, high = (_integer(bound, where, 1) for bound in value)
        if low > high:
            raise ProfileError(f"{where}: low {low} is above high {high}")
        return low, high
    tokens = _integer(value, where, 1)
    return tokens, tokens


def _weights(
    value: object, names: tuple[str, ...], where: str, *, integers: bool = False
) -> dict[str, float]:
    section = _mapping(value, where)
    _only_keys(section, names, where)
    weights = {
        name: _integer(section[name], f"{where}.{name}", 0)
        if integers
        else _number(section[name], f"{where}.{name}")
        for name in names
        if name in section
    }
    if not any(weight > 0 for weight in weights.values()):
        raise ProfileError(f"{where} needs at least one positive weight among {', '.join(names)}")
    return weights


def _prompt_source(value: object, base: Path) -> PromptSource:
    where = "workload.prompts"
    section = _mapping(value, where)
    kind = _required(section, "source", where)
    if kind == "generated":
        _only_keys(section, ("source", "count", "seed"), where)
        return PromptSource(
            kind="generated",
            count=_integer(section.get("count", 200), f"{where}.count", 1),
            seed=_integer(section.get("seed", 0), f"{where}.seed", 0),
        )
    if kind == "file":
        _only_keys(section, ("source", "path"), where)
        raw = _required(section, "path", where)
        if not isinstance(raw, str) or not raw:
            raise ProfileError(f"{where}.path must be a file path, got {raw!r}")
        path = Path(raw) if Path(raw).is_absolute() else base / raw
        if not path.is_file():
            raise ProfileError(f"{where}.path: no such file {path}")
        return PromptSource(kind="file", path=path)
    raise ProfileError(f"{where}.source must be 'generated' or 'file', got {kind!r}")


def _arrival(value: object) -> Arrival:
    where = "workload.arrival"
    section = _mapping(value, where)
    shape = _required(section, "shape", where)
    if shape in ("constant", "poisson"):
        _only_keys(section, ("shape", "rate"), where)
        return Arrival(
            shape=shape, rate=_number(_required(section, "rate", where), f"{where}.rate", positive=True)
        )
    if shape == "bursts":
        _only_keys(section, ("shape", "on_rate", "off_rate", "on_duration", "off_duration"), where)
        return Arrival(
            shape="bursts",
            on_rate=_number(_required(section, "on_rate", where), f"{where}.on_rate", positive=True),
            off_rate=_number(section.get("off_rate", 0), f"{where}.off_rate"),
            on_s=parse_timespan(_required(section, "on_duration", where), f"{where}.on_duration"),
            off_s=parse_timespan(_required(section, "off_duration", where), f"{where}.off_duration"),
        )
    raise ProfileError(f"{where}.shape must be one of {', '.join(ARRIVAL_SHAPES)}, got {shape!r}")


def _workload(value: object, base: Path) -> Workload:
    where = "workload"
    section = _mapping(value, where)
    _only_keys(
        section,
        (
            "users",
            "spawn_rate",
            "duration",
            "clients",
            "mix",
            "prompts",
            "max_tokens",
            "ignore_eos",
            "arrival",
            "request_timeout",
            "stop_timeout",
        ),
        where,
    )
    max_tokens_section = _mapping(section.get("max_tokens", {}), f"{where}.max_tokens")
    _only_keys(max_tokens_section, TASKS, f"{where}.max_tokens")
    users = _integer(_required(section, "users", where), f"{where}.users", 1)
    workload = Workload(
        users=users,
        spawn_rate=_number(section.get("spawn_rate", users), f"{where}.spawn_rate", positive=True),
        duration_s=parse_timespan(_required(section, "duration", where), f"{where}.duration"),
        clients=_weights(
            section.get("clients", {"grpc_stream": 1}), CLIENTS, f"{where}.clients", integers=True
        ),
        mix=_weights(_required(section, "mix", where), TASKS, f"{where}.mix"),
        prompts=_prompt_source(_required(section, "prompts", where), base),
        max_tokens={
            task: _token_range(tokens, f"{where}.max_tokens.{task}")
            for task, tokens in max_tokens_section.items()
        },
        arrival=_arrival(_required(section, "arrival", where)),
        request_timeout_s=parse_timespan(section.get("request_timeout", 60), f"{where}.request_timeout"),
        stop_timeout_s=parse_timespan(section.get("stop_timeout", 30), f"{where}.stop_timeout"),
        ignore_eos=_boolean(section.get("ignore_eos", False), f"{where}.ignore_eos"),
    )
    if len(workload.active_clients) > users:
        raise ProfileError(
            f"{where}.users is {users} but {len(workload.active_clients)} client kinds have a positive "
            "weight; give each at least one user"
        )
    return workload


def _sla(value: object, workload: Workload) -> SlaProfile:
    where = "sla"
    section = _mapping(value, where)
    _only_keys(section, ("max_error_rate", "tasks"), where)
    max_error_rate = _number(_required(section, "max_error_rate", where), f"{where}.max_error_rate")
    if max_error_rate > 1:
        raise ProfileError(f"{where}.max_error_rate is a fraction in [0, 1], got {max_error_rate}")
    tasks_section = _mapping(section.get("tasks", {}), f"{where}.tasks")
    _only_keys(tasks_section, TASKS, f"{where}.tasks")
    tasks = {}
    for task, raw_targets in tasks_section.items():
        task_where = f"{where}.tasks.{task}"
        if task not in workload.active_tasks:
            raise ProfileError(
                f"{task_where}: the workload mix never sends {task}, so its targets cannot be checked"
            )
        targets_section = _mapping(raw_targets, task_where)
        _only_keys(targets_section, ("ttft_p95_ms", "tpot_p95_ms", "e2e_p99_ms"), task_where)
        targets = TaskTargets(
            **{key: _number(v, f"{task_where}.{key}", positive=True) for key, v in targets_section.items()}
        )
        if "grpc_stream" not in workload.active_clients and (targets.ttft_p95_ms or targets.tpot_p95_ms):
            raise ProfileError(
                f"{task_where}: TTFT and TPOT are measured by the grpc_stream client, "
                "which has no weight in workload.clients"
            )
        tasks[task] = targets
    return SlaProfile(max_error_rate=max_error_rate, tasks=tasks)


def load_profile(path: str | Path) -> LoadProfile:
    """Read and validate a profile; raises ProfileError naming the first bad field."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ProfileError(f"cannot read profile {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"profile {path} is not valid YAML: {exc}") from None
    section = _mapping(document, f"profile {path}")
    _only_keys(section, ("name", "description", "workload", "sla"), f"profile {path}")
    name = section.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise ProfileError(f"name must be a non-empty string, got {name!r}")
    description = section.get("description", "")
    if not isinstance(description, str):
        raise ProfileError(f"description must be a string, got {description!r}")
    workload = _workload(_required(section, "workload", "profile"), path.resolve().parent)
    sla = _sla(_required(section, "sla", "profile"), workload)
    return LoadProfile(name=name, path=path, workload=workload, sla=sla, description=description)


def read_prompt_file(path: Path) -> list[tuple[str, str]]:
    """(task, text) pairs from a JSONL file whose lines are {"text": ..., "task": ...}."""
    pairs = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{where}: not a JSON object ({exc.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str) or not record["text"]:
            raise ProfileError(f'{where}: expected {{"text": "<prompt>", "task": "<task>"}}')
        if record.get("task") not in TASKS:
            raise ProfileError(f"{where}: task must be one of {', '.join(TASKS)}, got {record.get('task')!r}")
        pairs.append((record["task"], record["text"]))
    return pairs
