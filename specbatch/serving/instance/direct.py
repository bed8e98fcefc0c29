"""qwen3_specdec called directly (not through the scheduler): one execute() is one batch.

With `max_batch_size` > 0 (configs/cpu_triton_batching.pbtxt) Triton's own dynamic
batcher forms the batches and hands them to execute(), which runs them on this
instance's engine, answers each request as soon as its own rows are done, and returns
(taking the next batch) when the last row is: static batches, the baseline the
scheduler is measured against, answering as its users would have it. Rows go through
the same `InstanceRunner` as the scheduler's, with a collector in place of the
connection.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from specbatch.serving.instance.runner import InstanceRunner, Send
from specbatch.serving.messages import GENERATE, SCORE, Done, Message, RowOutcome, RowWork, Run
from specbatch.triton.outputs import DIRECT_OUTPUTS, outcome_arrays
from specbatch.triton.strings import texts

INPUTS = ("mode", "prompt", "max_tokens", "temperature", "top_p", "top_k", "choices", "stop")


def rows_from_arrays(arrays: Mapping[str, np.ndarray], first_row: int) -> list[RowWork]:
    """One request's rows; missing sampling inputs mean greedy defaults. Mode `score`
    makes scoring rows (each with its JSON list of `choices`)."""
    mode = texts(arrays["mode"])[0]
    prompts = texts(arrays["prompt"])
    count = len(prompts)

    def column(name: str, default: Any) -> list:
        return arrays[name].reshape(-1).tolist() if name in arrays else [default] * count

    max_tokens, temperature = column("max_tokens", 1), column("temperature", 0.0)
    top_p, top_k = column("top_p", 1.0), column("top_k", 0)
    choices = (
        [tuple(json.loads(c)) for c in texts(arrays["choices"])] if "choices" in arrays else [()] * count
    )
    stops = [tuple(json.loads(v)) for v in texts(arrays["stop"])] if "stop" in arrays else [()] * count
    return [
        RowWork(
            row=first_row + i,
            kind=SCORE if mode == "score" else GENERATE,
            prompt=prompts[i],
            mode="speculative" if mode == "score" else mode,
            max_tokens=int(max_tokens[i]),
            temperature=float(temperature[i]),
            top_p=float(top_p[i]),
            top_k=int(top_k[i]),
            stop=stops[i],
            choices=choices[i],
        )
        for i in range(count)
    ]


def run_rows(
    runner_for: Callable[[Send], InstanceRunner],
    rows: Sequence[RowWork],
    owners: Sequence[int] | None = None,
    answer: Callable[[int, list[RowOutcome]], None] | None = None,
) -> list[RowOutcome]:
    """Run rows on a fresh runner (``runner_for(send)``) and wait for every outcome.

    ``owners[i]`` names the request row i belongs to; ``answer(owner, outcomes)`` is
    called, from the runner's thread, as soon as that request's last row is done, so a
    short request in a static batch is not held until the batch's longest row ends (its
    model is decoupled: a response may go out before execute() returns)."""
    owner_of = {row.row: owner for row, owner in zip(rows, owners or [0] * len(rows), strict=True)}
    left = Counter(owner_of.values())
    outcomes: dict[int, RowOutcome] = {}
    finished = threading.Event()
    lock = threading.Lock()

    def collect(message: Message) -> None:
        if not isinstance(message, Done):
            return
        owner = owner_of[message.row]
        with lock:
            outcomes[message.row] = message.outcome
            left[owner] -= 1
            complete = left[owner] == 0
            mine = [outcomes[row.row] for row in rows if owner_of[row.row] == owner] if complete else []
            if len(outcomes) == len(rows):
                finished.set()
        if complete and answer is not None:
            answer(owner, mine)

    runner = runner_for(collect)
    if rows:
        runner.handle(Run(tuple(rows)))
        finished.wait()
    return [outcomes[row.row] for row in rows]


def direct_arrays(outcomes: Sequence[RowOutcome]) -> dict[str, np.ndarray]:
    """The outputs of a direct call, in row order."""
    return {name: array for name, array in outcome_arrays(outcomes).items() if name in DIRECT_OUTPUTS}
