"""One prompt at a time over tritonclient's gRPC stream, with the instants a load test needs.

The stream stays open across requests (one per Locust user), the way a real streaming
client holds its connection. tritonclient reads the stream in a thread and hands each
response to a callback; the callback only puts it on a queue and the caller waits on
that queue. Under Locust the thread is a greenlet and the queue a gevent queue, which
works only once `enable_grpc_under_gevent()` has made grpcio cooperate with gevent:
without it the first blocking read stalls every user in the process.

With `stream` = True the server answers with text deltas (responses that are not
final and whose `finish_reason` is empty), then a final response with the counters.
The first delta's arrival is the first token; a server that sends only the final
response gives no such instant (see `specbatch.loadtest.timing` for the fallback).
"""

from __future__ import annotations

import queue
import time
import uuid
from dataclasses import dataclass

import numpy as np
from specbatch_client.api import MODEL

from specbatch.triton.stream_flags import is_final_response

GRPC_HOST_ENV = "SPECBATCH_GRPC_HOST"
FAILED_FINISH_REASONS = ("error", "cancelled")


def enable_grpc_under_gevent() -> None:
    """Make grpcio's blocking calls yield to gevent; call before the first channel is made."""
    from grpc.experimental import gevent as grpc_gevent

    grpc_gevent.init_gevent()


@dataclass(frozen=True)
class StreamedGeneration:
    """What one streamed request produced and when (monotonic seconds)."""

    start: float
    first_delta: float | None
    end: float
    finish_reason: str
    output_tokens: int
    error: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.error) or self.finish_reason in FAILED_FINISH_REASONS


class StreamRequestError(RuntimeError):
    """The request got no usable final response: a stream error, a refusal, or a timeout."""


def _tensor(grpcclient, name: str, array: np.ndarray):
    datatype = {np.object_: "BYTES", np.int32: "INT32", np.bool_: "BOOL"}[array.dtype.type]
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _first_value(result, name: str, default: object) -> object:
    array = result.as_numpy(name)
    if array is None or array.size == 0:
        return default
    value = array.reshape(-1)[0]
    return value.decode(errors="replace") if isinstance(value, bytes) else value.item()


class StreamingGenerateClient:
    """`generate(prompt)` sends one request with `stream` = True and waits for its final response."""

    def __init__(self, url: str, timeout_s: float = 60.0) -> None:
        import tritonclient.grpc as grpcclient

        self._grpcclient = grpcclient
        self.url = url
        self.timeout_s = timeout_s
        self._client = grpcclient.InferenceServerClient(url)
        self._responses: queue.Queue = queue.Queue()
        self._streaming = False

    def _open_stream(self) -> None:
        self._responses = queue.Queue()
        responses = self._responses
        self._client.start_stream(
            callback=lambda result, error: responses.put((time.monotonic(), result, error))
        )
        self._streaming = True

    def _reset_stream(self) -> None:
        """Drop the stream after a failure so no late response of that request reaches the next one."""
        if self._streaming:
            self._client.stop_stream(cancel_requests=True)
            self._streaming = False

    def generate(
        self, prompt: str, max_tokens: int | None = None, ignore_eos: bool = False
    ) -> StreamedGeneration:
        """Send `prompt` (with ``ignore_eos``, to run to ``max_tokens`` through
        end-of-sequence); raises StreamRequestError when no final response arrives in time."""
        if not self._streaming:
            self._open_stream()
        grpcclient = self._grpcclient
        inputs = [  # one batch entry: [1, N prompts]
            _tensor(grpcclient, "text_input", np.array([[prompt.encode()]], dtype=np.object_)),
            _tensor(grpcclient, "stream", np.array([[True]], dtype=np.bool_)),
        ]
        if max_tokens is not None:
            inputs.append(_tensor(grpcclient, "max_tokens", np.array([[max_tokens]], dtype=np.int32)))
        if ignore_eos:
            inputs.append(_tensor(grpcclient, "ignore_eos", np.array([[True]], dtype=np.bool_)))
        request_id = uuid.uuid4().hex
        start = time.monotonic()
        first_delta: float | None = None
        answer = None
        try:
            self._client.async_stream_infer(
                MODEL, inputs, request_id=request_id, enable_empty_final_response=True
            )
            deadline = start + self.timeout_s
            while True:
                try:
                    arrived, result, error = self._responses.get(
                        timeout=max(0.0, deadline - time.monotonic())
                    )
                except queue.Empty:
                    raise StreamRequestError(f"no final response within {self.timeout_s:.0f}s") from None
                if error is not None:
                    raise StreamRequestError(error.message() if hasattr(error, "message") else str(error))
                if result.get_response().id != request_id:
                    continue
                if not is_final_response(result.get_response()):
                    if _first_value(result, "finish_reason", "") == "":
                        first_delta = arrived if first_delta is None else first_delta
                    else:
                        answer = result
                    continue
                if not result.get_response().outputs and answer is not None:
                    # The answer came before a bare FINAL flag (a pattern Triton allows).
                    result = answer
                return self._finished(result, start, first_delta, arrived)
        except Exception:
            self._reset_stream()
            raise

    @staticmethod
    def _finished(result, start: float, first_delta: float | None, end: float) -> StreamedGeneration:
        if not result.get_response().outputs:
            raise StreamRequestError("the final response carried no outputs")
        return StreamedGeneration(
            start=start,
            first_delta=first_delta,
            end=end,
            finish_reason=str(_first_value(result, "finish_reason", "")),
            output_tokens=int(_first_value(result, "num_output_tokens", 0)),
            error=str(_first_value(result, "error", "")),
        )

    def close(self) -> None:
        self._reset_stream()
        self._client.close()
