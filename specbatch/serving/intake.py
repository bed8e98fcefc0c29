"""Admission of one ensemble request into the scheduler: validate, answer, or queue.

Every prompt leaves here either answered (graph, or an error of its own) or as a
`PromptJob` for a model. The request's response is assembled in input order and sent
once the last of its prompts is done.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specbatch.serving.chat import ChatFormat, parse_history
from specbatch.serving.dispatcher import PromptJob
from specbatch.serving.latency import PromptTiming
from specbatch.serving.outcomes import PromptOutcome, RequestAssembly
from specbatch.serving.params import (
    PromptError,
    ServingLimits,
    broadcast,
    decode_prompt,
    decode_stop_words,
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
    timeout_s: float | None = None
    chat: Sequence[bool] | None = None
    enable_thinking: Sequence[bool] | None = None
    chat_history: Sequence[bytes | str] | None = None
    stop_words: Sequence[bytes | str] | None = None


Completion = Callable[[list[PromptOutcome], list[PromptTiming]], None]
DeltaOut = Callable[[int, str, str], None]
ChatRenderer = Callable[[str, ChatFormat], str]


class RequestIntake:
    """Turns routed requests into immediate outcomes and model jobs."""

    def __init__(
        self,
        limits: ServingLimits,
        count_tokens: Callable[[str], int],
        max_context: int,
        clock: Callable[[], float],
        render_chat: ChatRenderer | None = None,
    ) -> None:
        """`render_chat(content, chat)` is the instance's rendering of a chat prompt, so a
        conversation is counted against the context exactly as the model will see it."""
        self._limits = limits
        self._count_tokens = count_tokens
        self._max_context = max_context
        self._clock = clock
        self._render_chat = render_chat
        self._serial = itertools.count()

    def admit(
        self, request: RoutedRequest, on_complete: Completion, on_delta: DeltaOut | None = None
    ) -> list[PromptJob]:
        """Answer what can be answered now; return the jobs to queue.

        `on_complete(outcomes, timings)` receives every prompt's outcome in input order,
        from whichever thread delivers the last one. For a streaming request,
        `on_delta(index, task, text)` receives each prompt's text as it grows; the
        deltas of a prompt add up to its final text. Malformed inputs as a whole raise
        RequestError.
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
        chat_columns = {
            name: broadcast(getattr(request, name), count, name)
            for name in ("chat", "enable_thinking", "chat_history")
        }
        stop = decode_stop_words(request.stop_words)
        tasks = broadcast(request.tasks, count, "task")
        predicted = broadcast(request.predicted_tokens, count, "predicted_tokens")
        assembly = RequestAssembly(count)
        serial = next(self._serial)
        now = self._clock()
        deadline = now + request.timeout_s if request.timeout_s else None
        streamed = [""] * count if request.stream and on_delta is not None else None
        timings: list[PromptTiming | None] = [None] * count

        def stream_text(index: int, task: str, text: str) -> None:
            if streamed is not None and on_delta is not None and text:
                streamed[index] += text
                on_delta(index, task, text)

        job_of: dict[int, PromptJob] = {}

        def deliver(index: int, outcome: PromptOutcome) -> None:
            job = job_of.get(index)
            if streamed is not None and outcome.text.startswith(streamed[index]):
                stream_text(index, outcome.task, outcome.text[len(streamed[index]) :])
            timings[index] = PromptTiming(
                arrival_s=now,
                done_s=self._clock(),
                dispatched_s=job.dispatched_s if job else None,
                first_token_s=job.first_token_s if job else None,
                output_tokens=outcome.num_output_tokens,
            )
            if assembly.fill(index, outcome):
                on_complete(assembly.outcomes(), [t for t in timings if t is not None])

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
                    stop=stop,
                    **{k: (v[index] if v else None) for k, v in columns.items()},
                )
                prepared = prepare_prompt(text, task, _chat_format(index, **chat_columns))
                if prepared.kind == ANSWER:
                    immediate.append((index, PromptOutcome(text=prepared.answer, task=task)))
                    continue
                input_tokens = self._check_context(prepared, sampling.max_tokens)
            except PromptError as exc:
                immediate.append((index, PromptOutcome.failed(str(exc), task=task)))
                continue
            job = PromptJob(
                key=(serial, index),
                prepared=prepared,
                sampling=sampling,
                input_tokens=input_tokens,
                predicted_tokens=max(1, min(int(predicted[index]), sampling.max_tokens)),
                arrival_s=now,
                deadline_s=deadline,
                on_done=lambda outcome, i=index: deliver(i, outcome),
                on_delta=(lambda text, i=index, t=task: stream_text(i, t, text))
                if streamed is not None
                else None,
            )
            job_of[index] = job
            jobs.append(job)
        for index, outcome in immediate:
            deliver(index, outcome)
        return jobs

    def _check_context(self, prepared: PreparedPrompt, max_tokens: int) -> int:
        text = prepared.model_prompt
        if prepared.chat is not None and self._render_chat is not None:
            text = self._render_chat(text, prepared.chat)
        input_tokens = self._count_tokens(text)
        needed = input_tokens + (max_tokens if prepared.kind == GENERATE else 1)
        if needed > self._max_context:
            raise PromptError(
                f"prompt is {input_tokens} tokens; with max_tokens={max_tokens} it needs {needed}, "
                f"over the model context of {self._max_context} tokens"
            )
        return input_tokens


def _chat_format(
    index: int,
    chat: Sequence[bool] | None,
    enable_thinking: Sequence[bool] | None,
    chat_history: Sequence[bytes | str] | None,
) -> ChatFormat | None:
    """Prompt `index`'s chat format, or None for a raw completion (the default)."""
    history = parse_history(chat_history[index]) if chat_history else ()
    if not (chat and chat[index]):
        if history:
            raise PromptError("chat_history needs chat=true")
        return None
    return ChatFormat(history=history, enable_thinking=bool(enable_thinking and enable_thinking[index]))
