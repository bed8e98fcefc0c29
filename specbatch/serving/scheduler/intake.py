"""Admission of one ensemble request into the scheduler: validate, then state and jobs.

Every prompt leaves here either settled at once (an error of its own) or as a
`PromptJob` of the request's `RequestState`. Problems with the request as a whole
(no prompt, too many, columns of the wrong length) raise RequestError.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specbatch.serving.chat import ChatFormat, parse_history
from specbatch.serving.params import (
    PromptError,
    RequestError,
    ServingLimits,
    broadcast,
    decode_prompt,
    decode_stop_words,
    sampling_params,
)
from specbatch.serving.scheduler.state import PromptJob, ReplySink, RequestState, Settled
from specbatch.serving.scheduler.tasks import GENERATE, SCORE, PreparedPrompt, prepare_prompt
from specbatch.serving.wire import RowOutcome

MAX_PROMPTS_PER_REQUEST = 64
MAX_PROMPT_BYTES = 1 << 20


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


ChatRenderer = Callable[[str, ChatFormat], str]


class RequestIntake:
    """Turns routed requests into a request state, its prompt jobs and immediate errors."""

    def __init__(
        self,
        limits: ServingLimits,
        count_tokens: Callable[[str], int],
        max_context: int,
        clock: Callable[[], float],
        render_chat: ChatRenderer | None = None,
        stream_interval_s: float = 0.0,
    ) -> None:
        """`render_chat(content, chat)` is the instance's rendering of a chat prompt, so a
        conversation is counted against the context exactly as the model will see it;
        `stream_interval_s` coalesces a streaming prompt's text (see RequestState)."""
        self._stream_interval_s = stream_interval_s
        self._limits = limits
        self._count_tokens = count_tokens
        self._max_context = max_context
        self._clock = clock
        self._render_chat = render_chat
        self._serial = itertools.count()

    def admit(
        self, request: RoutedRequest, reply: ReplySink, on_settled: Settled | None = None
    ) -> tuple[RequestState, list[PromptJob], list[tuple[int, RowOutcome]]]:
        """The request's state, the jobs to run, and the (index, error) pairs to settle now."""
        count = len(request.prompts)
        if count == 0:
            raise RequestError("text_input holds no prompt")
        if count > MAX_PROMPTS_PER_REQUEST:
            raise RequestError(
                f"text_input holds {count} prompts; at most {MAX_PROMPTS_PER_REQUEST} per request"
            )
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
        now = self._clock()
        state = RequestState(
            next(self._serial),
            count,
            reply,
            now,
            stream=request.stream,
            deadline_s=now + request.timeout_s if request.timeout_s else None,
            on_settled=on_settled,
            stream_interval_s=self._stream_interval_s,
        )
        jobs: list[PromptJob] = []
        errors: list[tuple[int, RowOutcome]] = []
        for index in range(count):
            task = tasks[index]
            try:
                if route_errors[index]:
                    raise PromptError(route_errors[index])
                raw = request.prompts[index]
                if len(raw) > MAX_PROMPT_BYTES:
                    raise PromptError(f"prompt is {len(raw)} bytes; at most {MAX_PROMPT_BYTES} per prompt")
                text = decode_prompt(raw)
                sampling = sampling_params(
                    self._limits,
                    stream=request.stream,
                    stop=stop,
                    **{k: (v[index] if v else None) for k, v in columns.items()},
                )
                prepared = prepare_prompt(text, task, _chat_format(index, **chat_columns))
                input_tokens = self.check_context(prepared, sampling.max_tokens)
            except PromptError as exc:
                errors.append((index, RowOutcome.failed(str(exc), task=task)))
                continue
            jobs.append(
                PromptJob(
                    state=state,
                    index=index,
                    prepared=prepared,
                    sampling=sampling,
                    input_tokens=input_tokens,
                    predicted_tokens=max(1, min(int(predicted[index]), sampling.max_tokens)),
                )
            )
        return state, jobs, errors

    def check_context(self, prepared: PreparedPrompt, max_tokens: int) -> int:
        if prepared.kind not in (GENERATE, SCORE):
            return 0
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
