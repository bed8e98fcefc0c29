"""Hostile input against the real server: generated JSON bodies at /generate and generated
tensors at the gRPC stream, while a well-formed request runs beside them throughout.

Every request must get exactly one well-formed answer: served, or an error naming the
problem (HTTP 400; on the stream, an error response), never a 200 carrying an error,
never a hang, never a crashed stub; and the concurrent request is answered correctly
all along. Triton 2.51 answers two malformations itself before the pipeline sees
them, wrong JSON types with HTTP 500 and /generate of a streaming request with 200 and
an error; the gateway in front of it turns both into the client's 400 (pinned by the
two tests before the last).

`make test` runs a few dozen derandomized examples per protocol; `make fuzz` runs many
more, freshly random (SPECBATCH_FUZZ_EXAMPLES, SPECBATCH_FUZZ_RANDOM=1).
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from fuzz_inputs import (
    REQUEST,
    UPSTREAM_COUNT,
    UPSTREAM_JSON,
    Drawn,
    Tensor,
    grpc_requests,
    http_bodies,
)
from helpers import GRAPH_ANSWER, GRAPH_PROMPT, INFOBENCH_PROMPT, grpc_generate
from hypothesis import HealthCheck, given, settings

pytestmark = pytest.mark.integration

FUZZ = settings(
    max_examples=int(os.environ.get("SPECBATCH_FUZZ_EXAMPLES", "50")),
    deadline=None,
    derandomize=os.environ.get("SPECBATCH_FUZZ_RANDOM") != "1",
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
ANSWER_TIMEOUT_S = 120.0
SERVED = ("stop", "length")
# What a crashed or wedged stub answers with: never acceptable, whatever the input.
BROKEN = ("stub process", "not healthy", "traceback", "internal error")


class Canary:
    """A well-formed graph request (HTTP) and generation (gRPC stream), one after the other,
    for as long as the fuzz runs; every answer must be right."""

    def __init__(self, server) -> None:
        self.server = server
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.rounds = 0
        self.thread = threading.Thread(target=self._run, name="canary", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            status, body = post_generate(self.server, {"text_input": GRAPH_PROMPT})
            if status != 200 or body.get("text_output") != GRAPH_ANSWER:
                self.failures.append(f"graph over HTTP: {status} {body}")
            outputs, error = grpc_generate(
                self.server.grpc_url,
                {"text_input": np.array([INFOBENCH_PROMPT.encode()], dtype=np.object_),
                 "max_tokens": np.array([3], dtype=np.int32)},
                timeout_s=ANSWER_TIMEOUT_S,
            )  # fmt: skip
            if error or outputs.get("finish_reason", [None])[0] not in SERVED or outputs["error"] != [""]:
                self.failures.append(f"generation over gRPC: {error or outputs}")
            self.rounds += 1

    def __enter__(self) -> Canary:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        self.thread.join(timeout=2 * ANSWER_TIMEOUT_S)


@pytest.fixture(scope="module")
def canary(server) -> Iterator[Canary]:
    with Canary(server) as running:
        yield running


def post_generate(server, body: object, raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/specbatch/generate", data=data, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=ANSWER_TIMEOUT_S) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def column(body: dict, name: str) -> list:
    """An output of /generate as a list (one prompt comes back as a scalar)."""
    value = body[name]
    return value if isinstance(value, list) else [value]


def names_the_problem(message: str, drawn: Drawn) -> bool:
    return any(word.lower() in message.lower() for word in drawn.words())


def assert_served(prompts: list[str], finish: list[str], errors: list[str], texts: list[str], count: int):
    assert len(finish) == len(errors) == len(texts) == count, (finish, errors)
    assert all(reason in SERVED for reason in finish) and errors == [""] * count, (finish, errors)
    for prompt, text in zip(prompts, texts, strict=True):
        if prompt == GRAPH_PROMPT:
            assert text == GRAPH_ANSWER


def assert_prompt_errors(drawn: Drawn, finish: list[str], errors: list[str]) -> None:
    """A bad prompt of several fails alone: its error names the problem, the others are served."""
    assert len(finish) == len(errors) == drawn.prompts
    failed = [error for reason, error in zip(finish, errors, strict=True) if reason == "error"]
    assert failed, f"no prompt failed, expected one naming {drawn.words()}"
    assert all(any(w.lower() in e.lower() for w in drawn.words()) for e in failed), failed
    assert all(reason in SERVED for reason in finish if reason != "error"), finish


def check_http(drawn: Drawn, status: int, body: dict) -> None:
    scopes = drawn.scopes()
    error = body.get("error") if isinstance(body.get("error"), str) and "text_output" not in body else None
    assert not any(mark in json.dumps(body).lower() for mark in BROKEN), body
    if UPSTREAM_JSON in scopes:
        # Triton 2.51's JSON reader ("Unable to parse ..."): its 500 is the gateway's 400.
        assert status == 400 and error and "parse" in error.lower(), (status, body)
        return
    if UPSTREAM_COUNT in scopes:
        # /generate of a streaming request: Triton's 200 carrying only "exactly 1 response"
        # is the gateway's 400 (test_generate_with_stream_true_is_a_client_error).
        if error is not None and "exactly 1 response" in error:
            assert status == 400, (status, body)
            return
        if status == 200:
            assert error is None, body
            return
    if not drawn.problems:
        assert status == 200 and error is None, (status, body)
        prompts = drawn.payload["text_input"]
        prompts = prompts if isinstance(prompts, list) else [prompts]
        if drawn.payload.get("task_override"):
            prompts = [None] * len(prompts)
        finish, errors, texts = (column(body, name) for name in ("finish_reason", "error", "text_output"))
        assert_served(prompts, finish, errors, texts, drawn.prompts)
        return
    if REQUEST in scopes or drawn.prompts == 1:
        assert status == 400 and error and names_the_problem(error, drawn), (status, body, drawn.words())
        return
    assert status == 200 and error is None, (status, body)
    assert_prompt_errors(drawn, column(body, "finish_reason"), column(body, "error"))


@FUZZ
@given(drawn=http_bodies())
def test_generate_answers_every_body_once(server, canary, drawn):
    status, body = post_generate(server, drawn.payload)
    check_http(drawn, status, body)


def stream_once(server, tensors: list[Tensor]) -> tuple[dict | None, str | None]:
    """One request on a fresh gRPC stream: (outputs, None) or (None, error); fails on a hang
    or on a second answer."""
    replies: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = []
    for tensor in tensors:
        infer_input = grpcclient.InferInput(tensor.name, list(tensor.array.shape), tensor.datatype)
        infer_input.set_data_from_numpy(tensor.array)
        inputs.append(infer_input)
    try:
        client.start_stream(callback=lambda result, error: replies.put((result, error)))
        client.async_stream_infer("specbatch", inputs, enable_empty_final_response=True)
        try:
            result, error = replies.get(timeout=ANSWER_TIMEOUT_S)
        except queue.Empty:
            pytest.fail(f"no answer within {ANSWER_TIMEOUT_S:.0f} s")
    finally:
        client.stop_stream()
        client.close()
    assert replies.empty(), "more than one answer"
    if error is not None:
        return None, error.message()
    response = result.get_response()
    assert response.parameters["triton_final_response"].bool_param, "the only answer is not final"
    outputs = {
        output.name: [v.decode(errors="replace") if isinstance(v, bytes) else v.item()
                      for v in result.as_numpy(output.name).reshape(-1)]
        for output in response.outputs
    }  # fmt: skip
    return outputs, None


def check_grpc(drawn: Drawn, outputs: dict | None, error: str | None) -> None:
    assert not (error and any(mark in error.lower() for mark in BROKEN)), error
    if not drawn.problems:
        assert error is None, error
        finish, errors, texts = (outputs[name] for name in ("finish_reason", "error", "text_output"))
        assert_served([None] * drawn.prompts, finish, errors, texts, drawn.prompts)
        return
    if REQUEST in drawn.scopes() or drawn.prompts == 1:
        assert error and names_the_problem(error, drawn), (error, outputs, drawn.words())
        return
    assert error is None, error
    assert_prompt_errors(drawn, outputs["finish_reason"], outputs["error"])


@FUZZ
@given(drawn=grpc_requests())
def test_the_grpc_stream_answers_every_request_once(server, canary, drawn):
    outputs, error = stream_once(server, drawn.payload)
    check_grpc(drawn, outputs, error)


@pytest.mark.parametrize("body", [{}, {"max_tokens": 4}, {"task_override": "graph", "stream": False}])
def test_http_body_without_text_input_is_a_client_error(server, body):
    """Once a 200 'generate expects model to produce exactly 1 response': see the ensemble's config."""
    status, reply = post_generate(server, body)
    assert status == 400 and "text_input" in reply["error"], (status, reply)


def test_grpc_request_without_text_input_is_answered(server):
    """Once never answered (a client that leaves empty final responses off waited forever)."""
    replies: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    max_tokens = grpcclient.InferInput("max_tokens", [1, 1], "INT32")
    max_tokens.set_data_from_numpy(np.array([[4]], dtype=np.int32))
    try:
        client.start_stream(callback=lambda result, error: replies.put((result, error)))
        client.async_stream_infer("specbatch", [max_tokens])
        _, error = replies.get(timeout=ANSWER_TIMEOUT_S)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    assert error is not None and "text_input" in error.message()


def test_a_huge_prompt_is_refused_at_once_by_its_size(server):
    """By its byte count, before it is tokenized: in full, 4 MB took the pipeline 15 s."""
    start = time.monotonic()
    _, error = stream_once(
        server, [Tensor("text_input", "BYTES", np.array([[b"word " * 800_000]], dtype=np.object_))]
    )
    elapsed = time.monotonic() - start
    assert error and "bytes" in error and elapsed < 5.0, (error, elapsed)


# Values Triton's front ends pass through as they are, refused by the pipeline.


def test_an_infinite_temperature_is_refused(server):
    outputs, error = stream_once(
        server,
        [Tensor("text_input", "BYTES", np.array([[INFOBENCH_PROMPT.encode()]], dtype=np.object_)),
         Tensor("temperature", "FP32", np.array([[np.inf]], dtype=np.float32)),
         Tensor("max_tokens", "INT32", np.array([[2]], dtype=np.int32))],
    )  # fmt: skip
    assert error and "temperature" in error, (outputs, error)


def test_a_temperature_beyond_fp32_is_refused(server):
    body = {"text_input": INFOBENCH_PROMPT, "temperature": 1e39, "max_tokens": 2}
    status, reply = post_generate(server, body)
    assert status == 400 and "temperature" in reply["error"], (status, reply)


def test_non_utf8_stop_words_are_refused(server):
    outputs, error = stream_once(
        server,
        [Tensor("text_input", "BYTES", np.array([[INFOBENCH_PROMPT.encode()]], dtype=np.object_)),
         Tensor("stop_words", "BYTES", np.array([[b"\xffend"]], dtype=np.object_)),
         Tensor("max_tokens", "INT32", np.array([[2]], dtype=np.int32))],
    )  # fmt: skip
    assert error and "stop_words" in error and "UTF-8" in error, (outputs, error)


@pytest.mark.parametrize(
    "raw",
    [b'{"text_input": 5}', b'{"text_input": "hi", "max_tokens": "four"}', b'{"text_input": "\\ud800"}'],
)
def test_json_type_errors_are_client_errors(server, raw):
    """Triton 2.51's JSON reader answers these with 500; the gateway in front of it
    answers the client's 400."""
    status, body = post_generate(server, None, raw=raw)
    assert status == 400, (status, body)


def test_generate_with_stream_true_is_a_client_error(server):
    """Triton 2.51 answers /generate with 200 and an error when the model responds more
    than once; the gateway in front of it answers the client's 400."""
    status, body = post_generate(server, {"text_input": INFOBENCH_PROMPT, "stream": True, "max_tokens": 2})
    assert status == 400, (status, body)


def test_the_server_and_the_concurrent_request_survived_the_fuzz(server, canary):
    """Runs last in this module (file order): the canary saw only right answers throughout."""
    assert server.process.poll() is None, "tritonserver exited"
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=10) as reply:
        assert reply.status == 200
    rounds = canary.rounds
    assert post_generate(server, {"text_input": GRAPH_PROMPT})[1]["text_output"] == GRAPH_ANSWER
    assert canary.failures == []
    assert rounds >= 1, "the concurrent request never completed a round"
