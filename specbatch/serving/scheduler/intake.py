"""A request entering the scheduler: validated into its state and one record per prompt.

Every prompt leaves here prepared for its task (its model text rendered and counted
against the context), or with an error of its own to answer it with. Problems with
the request as a whole (no prompt, too many, columns of the wrong length) raise
RequestError. A prompt that asks for self-refinement is also checked, before it runs,
to leave room in the context for its refining pass (see `refine`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specbatch.serving.chat import ChatFormat, parse_history
from specbatch.serving.messages import GENERATE, SCORE, RowOutcome
from specbatch.serving.params import (
    PromptError,
    RequestError,
    ServingLimits,
    broadcast,
    decode_logit_bias,
    decode_prompt,
    decode_stop_token_ids,
    decode_stop_words,
    sampling_params,
)
from specbatch.serving.scheduler.records import PromptRecord, ReplySink, RequestState, Settled
from specbatch.serving.scheduler.tasks import PreparedPrompt, prepare_prompt, refine_prompt
from specbatch.serving.target_text import TargetText

MAX_PROMPTS_PER_REQUEST = 64
MAX_PROMPT_BYTES = 1 << 20
# per-prompt inputs ([1] or [N]): the sampling parameters, then the chat format
SAMPLING_COLUMNS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "random_seed",
    "ignore_eos",
    "min_tokens",
    "logprobs",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "include_stop_str_in_output",
)
CHAT_COLUMNS = ("chat", "enable_thinking", "chat_history")


@dataclass(frozen=True)
class RoutedRequest:
    """The scheduler's inputs for one request, decoded from its tensors."""

    prompts: Sequence[bytes | str]
    tasks: Sequence[str]
    route_errors: Sequence[str] = ()
    max_tokens: Sequence[int] | None = None
    temperature: Sequence[float] | None = None
    top_p: Sequence[float] | None = None
    top_k: Sequence[int] | None = None
    min_p: Sequence[float] | None = None
    random_seed: Sequence[int] | None = None
    ignore_eos: Sequence[bool] | None = None
    min_tokens: Sequence[int] | None = None
    min_length: Sequence[int] | None = None  # TensorRT-LLM's name of min_tokens
    logprobs: Sequence[int] | None = None
    presence_penalty: Sequence[float] | None = None
    frequency_penalty: Sequence[float] | None = None
    repetition_penalty: Sequence[float] | None = None
    include_stop_str_in_output: Sequence[bool] | None = None
    stream: bool = False
    timeout_s: float | None = None
    chat: Sequence[bool] | None = None
    enable_thinking: Sequence[bool] | None = None
    chat_history: Sequence[bytes | str] | None = None
    stop_words: Sequence[bytes | str] | None = None
    stop_token_ids: Sequence[int] | None = None
    logit_bias_ids: Sequence[int] | None = None
    logit_bias_values: Sequence[float] | None = None
    self_refine: Sequence[bool] | None = None


Failures = list[tuple[PromptRecord, RowOutcome]]


class RequestIntake:
    """Turns routed requests into a request state, its prompt records and their errors."""

    def __init__(
        self,
        limits: ServingLimits,
        target: TargetText,
        clock: Callable[[], float],
        stream_interval_s: float = 0.0,
    ) -> None:
        """``stream_interval_s`` coalesces a streaming prompt's text (see RequestState)."""
        self._limits = limits
        self._target = target
        self._clock = clock
        self._stream_interval_s = stream_interval_s
        self._ids = itertools.count()

    def receive(
        self, request: RoutedRequest, reply: ReplySink, on_settled: Settled | None = None
    ) -> tuple[RequestState, Failures]:
        """The request's state with a record per prompt, and the records to fail at once
        (with their errors); the others are prepared to run."""
        count = len(request.prompts)
        if count == 0:
            raise RequestError("text_input holds no prompt")
        if count > MAX_PROMPTS_PER_REQUEST:
            raise RequestError(
                f"text_input holds {count} prompts; at most {MAX_PROMPTS_PER_REQUEST} per request"
            )
        columns = {name: broadcast(getattr(request, name), count, name) for name in SAMPLING_COLUMNS}
        if request.min_length is not None:
            if request.min_tokens is not None:
                raise RequestError("min_tokens and min_length are one input (vLLM's, TensorRT-LLM's name)")
            columns["min_tokens"] = broadcast(request.min_length, count, "min_length")
        route_errors = (
            broadcast(request.route_errors, count, "route_error") if request.route_errors else [""] * count
        )
        chat_columns = {name: broadcast(getattr(request, name), count, name) for name in CHAT_COLUMNS}
        refine = broadcast(request.self_refine, count, "self_refine") or [False] * count
        stop = decode_stop_words(request.stop_words)
        stop_token_ids = decode_stop_token_ids(request.stop_token_ids)
        logit_bias = decode_logit_bias(request.logit_bias_ids, request.logit_bias_values)
        tasks = broadcast(request.tasks, count, "task")
        now = self._clock()
        state = RequestState(
            reply,
            now,
            stream=request.stream,
            deadline_s=now + request.timeout_s if request.timeout_s else None,
            stream_interval_s=self._stream_interval_s,
            on_settled=on_settled,
        )
        failures: Failures = []
        for index in range(count):
            record = state.add_prompt(next(self._ids), tasks[index])
            record.self_refine = bool(refine[index])
            try:
                if route_errors[index]:
                    raise PromptError(route_errors[index])
                raw = request.prompts[index]
                if len(raw) > MAX_PROMPT_BYTES:
                    raise PromptError(f"prompt is {len(raw)} bytes; at most {MAX_PROMPT_BYTES} per prompt")
                record.sampling = sampling_params(
                    self._limits,
                    stream=request.stream,
                    stop=stop,
                    stop_token_ids=stop_token_ids,
                    logit_bias=logit_bias,
                    **{k: (v[index] if v else None) for k, v in columns.items()},
                )
                self.prepare(record, decode_prompt(raw), tasks[index], _chat_format(index, **chat_columns))
            except PromptError as exc:
                failures.append((record, RowOutcome.failed(str(exc))))
        return state, failures

    def prepare(self, record: PromptRecord, text: str, task: str, chat: ChatFormat | None) -> None:
        """Ready ``record`` for ``task``: its stage, the exact text the model will see, and
        that text's tokens within the model's context (PromptError otherwise)."""
        prepared = prepare_prompt(text, task, chat)
        self._place(record, prepared)
        if record.refines_next:
            # Refused now, not after a first pass spent for nothing: the refining prompt
            # holds the question, then the first answer (up to max_tokens), then generates.
            max_tokens = record.sampling.max_tokens
            empty = refine_prompt(prepared, "")
            base = self._target.count(self._target.model_text(empty.model_prompt, empty.chat))
            if base + 2 * max_tokens > self._target.max_context:
                raise PromptError(
                    f"self_refine: the refining prompt is {base} tokens before the first answer; with "
                    f"max_tokens={max_tokens} for each pass it needs {base + 2 * max_tokens}, over the "
                    f"model context of {self._target.max_context} tokens"
                )

    def refine(self, record: PromptRecord, first: RowOutcome) -> None:
        """Ready ``record``'s refining pass on its ``first`` answer, with the same sampling;
        PromptError if that prompt outgrew the context (its answer re-tokenized longer)."""
        record.first_pass = first
        try:
            self._place(record, refine_prompt(record.prepared, first.text))
        except PromptError as exc:
            raise PromptError(f"self_refine: the refining {exc}") from None

    def _place(self, record: PromptRecord, prepared: PreparedPrompt) -> None:
        record.prepared, record.task = prepared, prepared.task
        if prepared.kind not in (GENERATE, SCORE):
            record.model_text, record.input_tokens = prepared.model_prompt, 0
            return
        record.model_text = self._target.model_text(prepared.model_prompt, prepared.chat)
        record.input_tokens = self._target.count(record.model_text)
        assert record.sampling is not None
        max_tokens = record.sampling.max_tokens
        needed = record.input_tokens + (max_tokens if prepared.kind == GENERATE else 1)
        if needed > self._target.max_context:
            raise PromptError(
                f"prompt is {record.input_tokens} tokens; with max_tokens={max_tokens} it needs {needed}, "
                f"over the model context of {self._target.max_context} tokens"
            )


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
