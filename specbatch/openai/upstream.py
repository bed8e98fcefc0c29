"""The pipeline over Triton's gRPC API: the router's answer, then the scheduler's stream.

These are the two steps of the `specbatch` ensemble, called one after the other with
the same tensors the ensemble passes between them. The front calls them itself
because Triton 2.51 does not pass a client's cancellation on to the steps of an
ensemble: through the ensemble, a client that disconnects would leave its rows
generating to the end, while a cancelled stream to the scheduler frees them within
one decode step. A unit test holds this mapping to ensemble/specbatch/config.pbtxt.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from specbatch.openai.errors import OpenAIError, from_pipeline
from specbatch.openai.requests import Call, copy_seed

ROUTER_OUTPUTS = ("routed_task", "route_error")
SCHEDULER_OUTPUTS = (
    "text_output",
    "index",
    "task",
    "finish_reason",
    "error",
    "num_input_tokens",
    "num_output_tokens",
    "token_logprobs",
)


@dataclass(frozen=True)
class Delta:
    """New text of prompt `index` while streaming, with the pipeline's token_logprobs JSON
    of the tokens it completes ("" when none were asked for)."""

    index: int
    text: str
    logprobs: str = ""


@dataclass(frozen=True)
class Outcome:
    """One prompt's final answer (its text is empty when it was streamed)."""

    text: str
    task: str
    finish_reason: str
    error: str
    num_input_tokens: int
    num_output_tokens: int
    logprobs: str = ""  # the pipeline's token_logprobs JSON; "" when none were asked or made


class TritonUpstream:
    """One gRPC channel to tritonserver, shared by every request of the front."""

    def __init__(self, url: str, router: str = "router", scheduler: str = "scheduler") -> None:
        self.url = url
        self._client = grpcclient.InferenceServerClient(url)
        self._router = router
        self._scheduler = scheduler

    async def ready(self) -> bool:
        try:
            return bool(await self._client.is_server_ready())
        except InferenceServerException:
            return False

    async def close(self) -> None:
        await self._client.close()

    async def run(self, call: Call) -> AsyncIterator[Delta | list[Outcome]]:
        """Deltas (when streaming), then every prompt's outcome in order, then nothing.

        Leaving the iteration early (a client gone, a cancelled task) cancels the
        scheduler's stream, which drops the request's rows at the next decode step.
        """
        routed = await self._route(call.prompts[:: call.copies])  # each prompt once, not per copy
        routed = {name: np.repeat(array, call.copies, axis=1) for name, array in routed.items()}
        responses = self._client.stream_infer(_one(self._scheduler_request(call, routed)))
        finished = False
        try:
            with _upstream_errors():
                async for result, error in responses:
                    if error is not None:
                        finished = True
                        raise from_pipeline(error.message())
                    response = result.get_response()
                    final = response.parameters["triton_final_response"].bool_param
                    outputs = {name: result.as_numpy(name) for name in SCHEDULER_OUTPUTS}
                    if final:
                        finished = True
                        yield _outcomes(outputs)
                        return
                    for index, text, logprobs in zip(
                        outputs["index"].reshape(-1),
                        _texts(outputs["text_output"]),
                        _texts(outputs["token_logprobs"]),
                        strict=True,
                    ):
                        yield Delta(int(index), text, logprobs)
                raise OpenAIError(502, "the pipeline closed the stream without a final response")
        finally:
            if not finished:
                responses.cancel()

    async def _route(self, prompts: tuple[str, ...]) -> dict[str, np.ndarray]:
        text = grpcclient.InferInput("text_input", [1, len(prompts)], "BYTES")
        text.set_data_from_numpy(_strings(prompts))
        outputs = [grpcclient.InferRequestedOutput(name) for name in ROUTER_OUTPUTS]
        with _upstream_errors():
            result = await self._client.infer(self._router, [text], outputs=outputs)
        return {name: result.as_numpy(name) for name in ROUTER_OUTPUTS}

    def _scheduler_request(self, call: Call, routed: dict[str, np.ndarray]) -> dict:
        inputs = []
        for name, array in scheduler_arrays(call, routed).items():
            tensor = grpcclient.InferInput(name, list(array.shape), triton_datatype(array.dtype))
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        return {
            "model_name": self._scheduler,
            "inputs": inputs,
            "outputs": [grpcclient.InferRequestedOutput(name) for name in SCHEDULER_OUTPUTS],
            "request_id": uuid.uuid4().hex,
        }


def scheduler_arrays(call: Call, routed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The scheduler step's inputs, as the ensemble would fill them: one batch entry [1, N]."""
    arrays: dict[str, np.ndarray] = {"text_input": _strings(call.prompts), **routed}
    arrays["stream"] = np.array([[call.stream]], dtype=np.bool_)
    optional = {
        "max_tokens": (call.max_tokens, np.int32),
        "temperature": (call.temperature, np.float32),
        "top_p": (call.top_p, np.float32),
        "top_k": (call.top_k, np.int32),
        "min_p": (call.min_p, np.float32),
        "min_tokens": (call.min_tokens or None, np.int32),
        "logprobs": (call.pipeline_logprobs, np.int32),
        "presence_penalty": (call.presence_penalty, np.float32),
        "frequency_penalty": (call.frequency_penalty, np.float32),
        "repetition_penalty": (call.repetition_penalty, np.float32),
    }
    for name, (value, dtype) in optional.items():
        if value is not None:
            arrays[name] = np.array([[value]], dtype=dtype)
    if call.seed is not None:
        seeds = [copy_seed(call.seed, index % call.copies) for index in range(len(call.prompts))]
        arrays["random_seed"] = np.array([seeds if call.copies > 1 else seeds[:1]], dtype=np.uint64)
    if call.stop:
        arrays["stop_words"] = _strings(call.stop)
    if call.logit_bias:
        arrays["logit_bias_ids"] = np.array([[token for token, _ in call.logit_bias]], dtype=np.int32)
        arrays["logit_bias_values"] = np.array([[value for _, value in call.logit_bias]], dtype=np.float32)
    if call.stop_token_ids:
        arrays["stop_token_ids"] = np.array([call.stop_token_ids], dtype=np.int32)
    if call.self_refine:
        arrays["self_refine"] = np.array([[True]], dtype=np.bool_)
    if call.ignore_eos:
        arrays["ignore_eos"] = np.array([[True]], dtype=np.bool_)
    if call.include_stop_str_in_output:
        arrays["include_stop_str_in_output"] = np.array([[True]], dtype=np.bool_)
    if call.kind == "chat":
        arrays["chat"] = np.array([[True]], dtype=np.bool_)
        arrays["enable_thinking"] = np.array([[call.enable_thinking]], dtype=np.bool_)
        arrays["chat_history"] = _strings([call.chat_history])
    return arrays


def triton_datatype(dtype: np.dtype) -> str:
    names = {
        np.object_: "BYTES",
        np.bool_: "BOOL",
        np.int32: "INT32",
        np.uint64: "UINT64",
        np.float32: "FP32",
    }
    return {np.dtype(k): v for k, v in names.items()}[np.dtype(dtype)]


async def _one(request: dict) -> AsyncIterator[dict]:
    yield request


def _strings(values) -> np.ndarray:
    return np.array([[v.encode("utf-8") for v in values]], dtype=np.object_)


def _texts(array: np.ndarray) -> list[str]:
    return [v.decode("utf-8", errors="replace") for v in array.reshape(-1)]


def _outcomes(outputs: dict[str, np.ndarray]) -> list[Outcome]:
    order = outputs["index"].reshape(-1).tolist()
    columns = [
        _texts(outputs["text_output"]),
        _texts(outputs["task"]),
        _texts(outputs["finish_reason"]),
        _texts(outputs["error"]),
        outputs["num_input_tokens"].reshape(-1).tolist(),
        outputs["num_output_tokens"].reshape(-1).tolist(),
        _texts(outputs["token_logprobs"]),
    ]
    by_index = {index: Outcome(*(column[i] for column in columns)) for i, index in enumerate(order)}
    return [by_index[index] for index in sorted(by_index)]


@contextlib.contextmanager
def _upstream_errors() -> Iterator[None]:
    """Triton's failures as the client's errors: Triton unreachable, not serving or gone
    mid-stream is 503; a refused request is the pipeline's own error."""
    try:
        yield
    except InferenceServerException as exc:
        status = str(exc.status() or "")
        if "UNAVAILABLE" in status or "UNIMPLEMENTED" in status or "CANCELLED" in status:
            raise _server_unavailable(exc.message()) from None
        raise from_pipeline(exc.message() or str(exc)) from None
    except grpc.RpcError as exc:  # the stream broke: tritonserver went away mid-request
        raise _server_unavailable(str(exc)) from None


def _server_unavailable(detail: str) -> OpenAIError:
    return OpenAIError(503, f"the inference server is unavailable: {detail}", code="unavailable")
