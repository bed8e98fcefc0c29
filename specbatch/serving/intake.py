"""Admission of one ensemble request into the scheduler: validate, answer, or queue.

Every prompt leaves here either answered (graph, or an error of its own) or as a
`PromptJob` for a model. The request's response is assembled in input order and sent
once the last of its prompts is done.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specbatch.serving.dispatcher import PromptJob
from specbatch.serving.outcomes import PromptOutcome, RequestAssembly
from specbatch.serving.params import (
    PromptError,
    ServingLimits,
    broadcast,
    decode_prompt,
    sampling_params,
)
from specbatch.serving.tasks import ANSWER, GENERATE, PreparedPrompt, prepare_prompt


@dataclass(frozen=True)
class RoutedRequest:
    """The scheduler's inputs for one request, decoded from its tensors."""

    prompts: Sequence[bytes | str]
    tasks: Sequence[str]
    predicted_tokens: Sequence[int]
    route_errors: Sequence[str] = ()
    max_tokens: Sequence[int] | None = None
    temperature: Sequence[float] | None = None
    top_p: Sequence[float] | None = None
    top_k: Sequence[int] | None = None
    stream: bool = False


class RequestIntake:
    """Turns routed requests into immediate outcomes and model jobs."""

    def __init__(
        self,
        limits: ServingLimits,
        count_tokens: Callable[[str], int],
        max_context: int,
        clock: Callable[[], float],
    ) -> None:
        self._limits = limits
        self._count_tokens = count_tokens
        self._max_context = max_context
        self._clock = clock
        self._serial = itertools.count()

    def admit(
        self, request: RoutedRequest, on_complete: Callable[[list[PromptOutcome]], None]
    ) -> list[PromptJob]:
        """Answer what can be answered now; return the jobs to queue.

        `on_complete` receives all outcomes in input order, from whichever thread
        delivers the last one. Malformed inputs as a whole raise RequestError.
        """
        count = len(request.prompts)
        if count == 0:
            raise PromptError("text_input holds no prompt")
        columns = {
            name: broadcast(getattr(request, name), count, name)
            for name in ("max_tokens", "temperature", "top_p", "top_k")
        }
        route_errors = (
            broadcast(request.route_errors, count, "route_error") if request.route_errors else [""] * count
        )
        tasks = broadcast(request.tasks, count, "task")
        predicted = broadcast(request.predicted_tokens, count, "predicted_tokens")
        assembly = RequestAssembly(count)
        serial = next(self._serial)
        now = self._clock()

        def deliver(index: int, outcome: PromptOutcome) -> None:
            if assembly.fill(index, outcome):
                on_complete(assembly.outcomes())

        immediate: list[tuple[int, PromptOutcome]] = []
        jobs: list[PromptJob] = []
        for index in range(count):
            task = tasks[index]
            try:
                if route_errors[index]:
                    raise PromptError(route_errors[index])
                text = decode_prompt(request.prompts[index])
                sampling = sampling_params(
                    self._limits,
                    stream=request.stream,
                    **{k: (v[index] if v else None) for k, v in columns.items()},
                )
                prepared = prepare_prompt(text, task)
                if prepared.kind == ANSWER:
                    immediate.append((index, PromptOutcome(text=prepared.answer, task=task)))
                    continue
                input_tokens = self._check_context(prepared, sampling.max_tokens)
            except PromptError as exc:
                immediate.append((index, PromptOutcome.failed(str(exc), task=task)))
                continue
            jobs.append(
                PromptJob(
                    key=(serial, index),
                    prepared=prepared,
                    sampling=sampling,
                    input_tokens=input_tokens,
                    predicted_tokens=max(1, int(predicted[index])),
                    arrival_s=now,
                    on_done=lambda outcome, i=index: deliver(i, outcome),
                )
            )
        for index, outcome in immediate:
            deliver(index, outcome)
        return jobs

    def _check_context(self, prepared: PreparedPrompt, max_tokens: int) -> int:
        input_tokens = self._count_tokens(prepared.model_prompt)
        needed = input_tokens + (max_tokens if prepared.kind == GENERATE else 1)
        if needed > self._max_context:
            raise PromptError(
                f"prompt is {input_tokens} tokens; with max_tokens={max_tokens} it needs {needed}, "
                f"over the model context of {self._max_context} tokens"
            )
        return input_tokens
