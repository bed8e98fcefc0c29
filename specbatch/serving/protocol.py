"""Tensors on the wire, as numpy arrays: ensemble outputs and the scheduler↔worker BLS call.

Kept free of triton_python_backend_utils so the packing round-trips in unit tests;
the model.py adapters only wrap these arrays in pb_utils.Tensor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np

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


def outcome_arrays(outcomes: Sequence[PromptOutcome]) -> dict[str, np.ndarray]:
    """The ensemble's outputs (DESIGN §2) for prompts in input order."""
    arrays = {
        "text_output": strings([o.text for o in outcomes]),
        "task": strings([o.task for o in outcomes]),
        "finish_reason": strings([o.finish_reason for o in outcomes]),
        "error": strings([o.error for o in outcomes]),
        "acceptance_rate": np.array([o.acceptance_rate for o in outcomes], dtype=np.float32),
    }
    for name in _COUNTERS:
        arrays[name] = np.array([getattr(o, name) for o in outcomes], dtype=np.uint32)
    return arrays


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
    """The scheduler's BLS request to qwen3_specdec."""
    return {
        "mode": strings([mode]),
        "prompt": strings([i.prompt for i in items]),
        "max_tokens": np.array([i.max_tokens for i in items], dtype=np.int32),
        "temperature": np.array([i.temperature for i in items], dtype=np.float32),
        "top_p": np.array([i.top_p for i in items], dtype=np.float32),
        "top_k": np.array([i.top_k for i in items], dtype=np.int32),
        "choices": strings([json.dumps(list(i.continuations)) for i in items]),
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
    items = [
        WorkItem(
            prompt=prompts[i],
            max_tokens=int(max_tokens[i]),
            temperature=float(temperature[i]),
            top_p=float(top_p[i]),
            top_k=int(top_k[i]),
            continuations=choices[i],
        )
        for i in range(count)
    ]
    return mode, items


def worker_result_arrays(result: WorkerResult) -> dict[str, np.ndarray]:
    arrays = outcome_arrays(result.outcomes)
    del arrays["task"], arrays["acceptance_rate"]
    arrays["seconds_per_token"] = np.array([result.seconds_per_token], dtype=np.float32)
    arrays["free_kv_tokens"] = np.array([result.free_kv_tokens], dtype=np.int64)
    return arrays


def batch_result_from_arrays(arrays: Mapping[str, np.ndarray]) -> BatchResult:
    return BatchResult(
        outcomes=outcomes_from_arrays(arrays),
        seconds_per_token=float(arrays["seconds_per_token"].reshape(-1)[0]),
        free_kv_tokens=int(arrays["free_kv_tokens"].reshape(-1)[0]),
    )
