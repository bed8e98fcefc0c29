"""Call the `specbatch` ensemble and get one Answer per prompt, in order.

The ensemble is decoupled (its scheduler answers later), so plain `/infer` refuses
it: HTTP goes through Triton's `/generate` endpoint and gRPC through the
bidirectional stream that tritonclient's `start_stream` opens.
"""

from __future__ import annotations

import contextlib
import json
import queue
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MODEL = "specbatch"
_COUNTERS = ("num_input_tokens", "num_output_tokens", "total_draft_tokens", "total_accepted_draft_tokens")


class ServerError(RuntimeError):
    """The server refused the whole request (a TritonError)."""


@dataclass(frozen=True)
class GenerationOptions:
    """Per-request sampling options; None leaves the server's per-task default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    task: str | None = None
    # drop tokens less likely than this share of the likeliest (vLLM's min_p; 0: off)
    min_p: float | None = None
    # a sampled prompt with a seed gives the same tokens on every call, in any batch
    random_seed: int | None = None
    # run every answer to max_tokens through end-of-sequence: fixed lengths for load tests
    ignore_eos: bool | None = None
    # neither end-of-sequence nor a stop string ends an answer before this many tokens
    min_tokens: int | None = None
    # each generated token's log-probability under the target and this many alternatives
    # (0-20) in Answer.token_logprobs
    logprobs: int | None = None
    # vLLM's penalties: on tokens already in the output (presence, frequency; -2 to 2) and
    # in the prompt or the output (repetition; > 1 discourages them)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    # the answer ends before the first of these strings, which it leaves out (TensorRT-LLM's
    # stop_words: at most 16, each up to 256 characters)
    stop: Sequence[str] | None = None
    # the answer ends at the first of these token ids, as at end-of-sequence (vLLM's
    # stop_token_ids: at most 16)
    stop_token_ids: Sequence[int] | None = None
    # added to these token ids' logits before sampling, -100 to 100 (OpenAI's logit_bias:
    # -100 bans a token, 100 all but forces it; at most 300 ids)
    logit_bias: Mapping[int, float] | None = None
    # the answer ends right after the stop string that ended it (vLLM's name)
    include_stop_str_in_output: bool | None = None

    def list_inputs(self) -> dict[str, tuple[list, type]]:
        """The request-wide list options as inputs: name -> (values, numpy dtype)."""
        inputs: dict[str, tuple[list, type]] = {}
        if self.stop:
            inputs["stop_words"] = ([str(s) for s in self.stop], np.object_)
        if self.stop_token_ids:
            inputs["stop_token_ids"] = ([int(i) for i in self.stop_token_ids], np.int32)
        if self.logit_bias:
            inputs["logit_bias_ids"] = ([int(i) for i in self.logit_bias], np.int32)
            inputs["logit_bias_values"] = ([float(v) for v in self.logit_bias.values()], np.float32)
        return inputs


# the options sent as inputs of the same name, one value for every prompt of the request,
# with the tensor type gRPC sends each as
OPTION_INPUTS = {
    "max_tokens": np.int32,
    "temperature": np.float32,
    "top_p": np.float32,
    "top_k": np.int32,
    "min_p": np.float32,
    "random_seed": np.uint64,
    "ignore_eos": np.bool_,
    "min_tokens": np.int32,
    "logprobs": np.int32,
    "presence_penalty": np.float32,
    "frequency_penalty": np.float32,
    "repetition_penalty": np.float32,
    "include_stop_str_in_output": np.bool_,
}


@dataclass(frozen=True)
class Answer:
    """One prompt's answer with its routing and speculative-decoding counters."""

    text: str
    task: str
    finish_reason: str
    num_input_tokens: int
    num_output_tokens: int
    total_draft_tokens: int
    total_accepted_draft_tokens: int
    acceptance_rate: float
    error: str = ""
    model_instance: str = ""  # the qwen3_specdec instance that ran it ("" when none did)
    # with GenerationOptions.logprobs, per generated token {"id", "token", "logprob",
    # "top_logprobs": [{"id", "token", "logprob"}, ...]}; None for an answer not generated
    token_logprobs: list[dict] | None = None


def _as_list(value: object) -> list:
    return value if isinstance(value, list) else [value]


def answers_from_columns(columns: dict[str, list]) -> list[Answer]:
    """Rows from the ensemble's output columns (JSON lists or decoded numpy arrays)."""
    texts = _as_list(columns["text_output"])
    count = len(texts)

    def column(name: str, default: object) -> list:
        return _as_list(columns[name]) if name in columns else [default] * count

    tasks, reasons, errors = column("task", ""), column("finish_reason", ""), column("error", "")
    rates = column("acceptance_rate", 0.0)
    counters = {name: column(name, 0) for name in _COUNTERS}
    instances = column("model_instance", "")
    logprobs = [json.loads(text) if text else None for text in column("token_logprobs", "")]
    return [
        Answer(
            text=texts[i],
            task=tasks[i],
            finish_reason=reasons[i],
            error=errors[i],
            acceptance_rate=float(rates[i]),
            model_instance=instances[i],
            token_logprobs=logprobs[i],
            **{name: int(counters[name][i]) for name in _COUNTERS},
        )
        for i in range(count)
    ]


class SpecbatchClient:
    """`SpecbatchClient("localhost:8000")` for HTTP, `SpecbatchClient("localhost:8001", "grpc")` for gRPC."""

    def __init__(self, url: str = "localhost:8000", protocol: str = "http", timeout_s: float = 600.0) -> None:
        if protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be 'http' or 'grpc', got {protocol!r}")
        self.url = url.removeprefix("http://")
        self.protocol = protocol
        self.timeout_s = timeout_s

    def generate(
        self, prompts: str | Sequence[str], options: GenerationOptions | None = None
    ) -> list[Answer]:
        """Answers in the order of `prompts`; raises ServerError if the server refused the request."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        options = options or GenerationOptions()
        if self.protocol == "http":
            return self._generate_http(prompts, options)
        return self._generate_grpc(prompts, options)

    def _generate_http(self, prompts: list[str], options: GenerationOptions) -> list[Answer]:
        body: dict[str, object] = {"text_input": prompts}
        for name in OPTION_INPUTS:
            value = getattr(options, name)
            if value is not None:
                body[name] = value
        for name, (values, _) in options.list_inputs().items():
            body[name] = values
        if options.task is not None:
            body["task_override"] = [options.task] * len(prompts)
        request = urllib.request.Request(
            f"http://{self.url}/v2/models/{MODEL}/generate",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                return answers_from_columns(json.loads(reply.read()))
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            with contextlib.suppress(json.JSONDecodeError):
                detail = json.loads(detail).get("error", detail)
            raise ServerError(detail) from None

    def _generate_grpc(self, prompts: list[str], options: GenerationOptions) -> list[Answer]:
        import tritonclient.grpc as grpcclient

        inputs = [
            _grpc_input(grpcclient, "text_input", np.array([[p.encode() for p in prompts]], dtype=np.object_))
        ]
        for name, dtype in OPTION_INPUTS.items():
            if (value := getattr(options, name)) is not None:
                inputs.append(_grpc_input(grpcclient, name, np.array([[value]], dtype=dtype)))
        for name, (values, dtype) in options.list_inputs().items():
            encoded = [v.encode() for v in values] if dtype is np.object_ else values
            inputs.append(_grpc_input(grpcclient, name, np.array([encoded], dtype=dtype)))
        if options.task is not None:
            inputs.append(
                _grpc_input(
                    grpcclient,
                    "task_override",
                    np.array([[options.task.encode()] * len(prompts)], dtype=np.object_),
                )
            )
        responses: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(self.url)
        try:
            client.start_stream(callback=lambda result, error: responses.put((result, error)))
            client.async_stream_infer(MODEL, inputs, request_id=uuid.uuid4().hex)
            result, error = responses.get(timeout=self.timeout_s)
        finally:
            client.stop_stream()
            client.close()
        if error is not None:
            raise ServerError(str(error.message() if hasattr(error, "message") else error))
        columns = {}
        for output in result.get_response().outputs:
            array = result.as_numpy(output.name)
            columns[output.name] = [
                v.decode() if isinstance(v, bytes) else v.item() for v in array.reshape(-1)
            ]
        return answers_from_columns(columns)


def _grpc_input(grpcclient, name: str, array: np.ndarray):
    numeric = {np.bool_: "BOOL", np.int32: "INT32", np.uint64: "UINT64", np.float32: "FP32"}
    datatype = "BYTES" if array.dtype == np.object_ else numeric[array.dtype.type]
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor
