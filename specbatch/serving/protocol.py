"""Tensors on the wire, as numpy arrays: ensemble outputs and the scheduler↔worker BLS call.

Kept free of triton_python_backend_utils so the packing round-trips in unit tests;
the model.py adapters only wrap these arrays in pb_utils.Tensor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np

from specbatch.serving.chat import ChatFormat, parse_history
from specbatch.serving.dispatcher import BatchResult
from specbatch.serving.outcomes import PromptOutcome
from specbatch.serving.worker import WorkerResult, WorkItem

_COUNTERS = ("num_input_tokens", "num_output_tokens", "total_draft_tokens", "total_accepted_draft_tokens")


def strings(values: Sequence[str]) -> np.ndarray:
    """A Triton STRING tensor (numpy object array of UTF-8 bytes)."""
    return np.array([v.encode("utf-8") for v in values], dtype=np.object_)


def texts(array: np.ndarray) -> list[str]:
    """A STRING tensor back to str, replacing undecodable bytes (callers validate prompts first)."""
    return [
        v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)
    ]


def outcome_arrays(
    outcomes: Sequence[PromptOutcome], indices: Sequence[int] | None = None, with_text: bool = True
) -> dict[str, np.ndarray]:
    """The ensemble's outputs (DESIGN §2): prompts in input order, or the prompts at `indices`.

    A streaming request's final response leaves the text out (`with_text=False`): it
    already went out as deltas.
    """
    indices = range(len(outcomes)) if indices is None else indices
    arrays = {
        "text_output": strings([o.text if with_text else "" for o in outcomes]),
        "index": np.array(indices, dtype=np.uint32),
        "task": strings([o.task for o in outcomes]),
        "finish_reason": strings([o.finish_reason for o in outcomes]),
        "error": strings([o.error for o in outcomes]),
        "acceptance_rate": np.array([o.acceptance_rate for o in outcomes], dtype=np.float32),
    }
    for name in _COUNTERS:
        arrays[name] = np.array([getattr(o, name) for o in outcomes], dtype=np.uint32)
    return arrays


def delta_arrays(index: int, task: str, text: str) -> dict[str, np.ndarray]:
    """One streaming delta of prompt `index`, with every ensemble output present."""
    return outcome_arrays([PromptOutcome(text=text, task=task, finish_reason="")], indices=[index])


def outcomes_from_arrays(arrays: Mapping[str, np.ndarray]) -> list[PromptOutcome]:
    """Inverse of `outcome_arrays` (the worker's rows carry no task)."""
    count = len(arrays["text_output"])
    task = texts(arrays["task"]) if "task" in arrays else [""] * count
    text, finish, error = texts(arrays["text_output"]), texts(arrays["finish_reason"]), texts(arrays["error"])
    counters = {name: arrays[name].reshape(-1).tolist() for name in _COUNTERS}
    return [
        PromptOutcome(
            text=text[i],
            task=task[i],
            finish_reason=finish[i],
            error=error[i],
            **{name: int(counters[name][i]) for name in _COUNTERS},
        )
        for i in range(count)
    ]


def work_arrays(mode: str, items: Sequence[WorkItem]) -> dict[str, np.ndarray]:
    """The scheduler's BLS request to qwen3_specdec (stop and chat columns only when a row has them)."""
    stop = {"stop": strings([json.dumps(list(i.stop)) for i in items])} if any(i.stop for i in items) else {}
    return {
        **stop,
        **_chat_arrays(items),
        "mode": strings([mode]),
        "prompt": strings([i.prompt for i in items]),
        "max_tokens": np.array([i.max_tokens for i in items], dtype=np.int32),
        "temperature": np.array([i.temperature for i in items], dtype=np.float32),
        "top_p": np.array([i.top_p for i in items], dtype=np.float32),
        "top_k": np.array([i.top_k for i in items], dtype=np.int32),
        "choices": strings([json.dumps(list(i.continuations)) for i in items]),
        "row_id": strings([i.row_id for i in items]),
        "stream": np.array([i.stream for i in items], dtype=np.bool_),
    }


def work_from_arrays(arrays: Mapping[str, np.ndarray]) -> tuple[str, list[WorkItem]]:
    """Inverse of `work_arrays`; missing sampling arrays mean greedy defaults."""
    mode = texts(arrays["mode"])[0]
    prompts = texts(arrays["prompt"])
    count = len(prompts)

    def column(name: str, default: float) -> list:
        return arrays[name].reshape(-1).tolist() if name in arrays else [default] * count

    max_tokens, temperature = column("max_tokens", 1), column("temperature", 0.0)
    top_p, top_k = column("top_p", 1.0), column("top_k", 0)
    choices = (
        [tuple(json.loads(c)) for c in texts(arrays["choices"])] if "choices" in arrays else [()] * count
    )
    row_ids = texts(arrays["row_id"]) if "row_id" in arrays else [""] * count
    stream = column("stream", False)
    chats = _chat_from_arrays(arrays, count)
    stops = [tuple(json.loads(v)) for v in texts(arrays["stop"])] if "stop" in arrays else [()] * count
    items = [
        WorkItem(
            prompt=prompts[i],
            max_tokens=int(max_tokens[i]),
            temperature=float(temperature[i]),
            top_p=float(top_p[i]),
            top_k=int(top_k[i]),
            continuations=choices[i],
            row_id=row_ids[i],
            stream=bool(stream[i]),
            chat=chats[i],
            stop=stops[i],
        )
        for i in range(count)
    ]
    return mode, items


def _chat_arrays(items: Sequence[WorkItem]) -> dict[str, np.ndarray]:
    if all(item.chat is None for item in items):
        return {}
    formats = [item.chat or ChatFormat() for item in items]
    return {
        "chat": np.array([item.chat is not None for item in items], dtype=np.bool_),
        "enable_thinking": np.array([f.enable_thinking for f in formats], dtype=np.bool_),
        "chat_history": strings([f.history_json() if f.history else "" for f in formats]),
        "assistant_prefix": strings([f.assistant_prefix for f in formats]),
    }


def _chat_from_arrays(arrays: Mapping[str, np.ndarray], count: int) -> list[ChatFormat | None]:
    if "chat" not in arrays:
        return [None] * count
    chat = arrays["chat"].reshape(-1).tolist()
    thinking = arrays["enable_thinking"].reshape(-1).tolist()
    history, prefix = texts(arrays["chat_history"]), texts(arrays["assistant_prefix"])
    return [
        ChatFormat(parse_history(history[i]), bool(thinking[i]), prefix[i]) if chat[i] else None
        for i in range(count)
    ]


def worker_result_arrays(result: WorkerResult) -> dict[str, np.ndarray]:
    """qwen3_specdec's final response to a batch."""
    arrays = outcome_arrays(result.outcomes)
    del arrays["task"], arrays["acceptance_rate"], arrays["index"]
    arrays["first_token_s"] = np.array(result.first_token_s, dtype=np.float32)
    arrays["seconds_per_token"] = np.array([result.seconds_per_token], dtype=np.float32)
    arrays["free_kv_tokens"] = np.array([result.free_kv_tokens], dtype=np.int64)
    return arrays


def worker_row_done_arrays(row: int, outcome: PromptOutcome, first_token_s: float) -> dict[str, np.ndarray]:
    """qwen3_specdec's early answer for one finished row of a batch still running."""
    arrays = worker_result_arrays(WorkerResult([outcome], 0.0, 0, [first_token_s]))
    del arrays["seconds_per_token"], arrays["free_kv_tokens"]
    arrays["done_row"] = np.array([row], dtype=np.int32)
    return arrays


def worker_row_done_from_arrays(arrays: Mapping[str, np.ndarray]) -> tuple[int, PromptOutcome, float]:
    [outcome] = outcomes_from_arrays(arrays)
    return int(arrays["done_row"].reshape(-1)[0]), outcome, float(arrays["first_token_s"].reshape(-1)[0])


def worker_delta_arrays(deltas: Sequence[tuple[int, str]]) -> dict[str, np.ndarray]:
    """qwen3_specdec's streaming response: one step's text deltas, by row."""
    return {
        "delta_row": np.array([row for row, _ in deltas], dtype=np.int32),
        "delta_text": strings([text for _, text in deltas]),
    }


def worker_deltas_from_arrays(arrays: Mapping[str, np.ndarray]) -> list[tuple[int, str]]:
    return list(zip(arrays["delta_row"].reshape(-1).tolist(), texts(arrays["delta_text"]), strict=True))


def batch_result_from_arrays(arrays: Mapping[str, np.ndarray]) -> BatchResult:
    return BatchResult(
        outcomes=outcomes_from_arrays(arrays),
        seconds_per_token=float(arrays["seconds_per_token"].reshape(-1)[0]),
        free_kv_tokens=int(arrays["free_kv_tokens"].reshape(-1)[0]),
        first_token_s=arrays["first_token_s"].reshape(-1).tolist() if "first_token_s" in arrays else [],
    )
