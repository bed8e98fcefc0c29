"""Streaming over the gRPC stream and /generate_stream, cancellation and deadlines."""

from __future__ import annotations

import json
import time
import urllib.request

import numpy as np
import pytest
from helpers import (
    GRAPH_ANSWER,
    GRAPH_PROMPT,
    INFOBENCH_DATASET_PROMPT,
    INFOBENCH_PROMPT,
    GrpcStream,
    metric_values,
    scrape,
)
from specbatch_client import GenerationOptions, SpecbatchClient

pytestmark = pytest.mark.integration

PROMPTS = [INFOBENCH_PROMPT, GRAPH_PROMPT, INFOBENCH_DATASET_PROMPT]
# Prompts the tiny pair continues greedily for 400 tokens without emitting EOS.
LONG = [
    f"Instruction: Tell a long story about {topic}.\nQuestion: \nGeneration:"
    for topic in ("dragons", "the sea", "a cat", "mountains")
]


def prompt_tensor(prompts: list[str]) -> np.ndarray:
    return np.array([p.encode() for p in prompts], dtype=np.object_)


def stream_inputs(prompts: list[str], max_tokens: int) -> dict:
    return {
        "text_input": prompt_tensor(prompts),
        "max_tokens": np.array([max_tokens], dtype=np.int32),
        "temperature": np.array([0.0], dtype=np.float32),
        "stream": np.array([True]),
    }


def reference_texts(server, prompts: list[str], max_tokens: int) -> list[str]:
    answers = SpecbatchClient(server.http_url).generate(prompts, GenerationOptions(max_tokens=max_tokens))
    return [a.text for a in answers]


def test_grpc_stream_sends_deltas_per_prompt_then_the_counters(server):
    expected = reference_texts(server, PROMPTS, 24)
    stream = GrpcStream(server.grpc_url)
    try:
        stream.send("s1", stream_inputs(PROMPTS, 24))
        pieces: dict[int, str] = {0: "", 1: "", 2: ""}
        deltas = 0
        while True:
            _, outputs, final, error = stream.next()
            assert error is None
            if final:
                break
            [index] = outputs["index"]
            pieces[index] += outputs["text_output"][0]
            deltas += 1
    finally:
        stream.close()
    assert [pieces[i] for i in range(3)] == expected
    assert pieces[1] == GRAPH_ANSWER
    assert deltas > 3, "the text came in one piece"
    assert outputs["index"] == [0, 1, 2]
    assert outputs["text_output"] == ["", "", ""]
    assert outputs["task"] == ["infobench", "graph", "infobench"]
    assert outputs["num_output_tokens"][0] > 0 and outputs["total_draft_tokens"][0] > 0


def test_generate_stream_sse_delivers_the_same_text(server):
    expected = reference_texts(server, [INFOBENCH_PROMPT], 16)
    body = json.dumps({"text_input": [INFOBENCH_PROMPT], "max_tokens": 16, "stream": True}).encode()
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/specbatch/generate_stream", data=body
    )
    events = []
    with urllib.request.urlopen(request, timeout=120) as reply:
        for line in reply:
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
    deltas = [e for e in events if e["finish_reason"] == [""] or e["finish_reason"] == ""]
    text = "".join(
        e["text_output"] if isinstance(e["text_output"], str) else e["text_output"][0] for e in deltas
    )
    assert text == expected[0]
    assert len(deltas) > 1
    final = events[-1]
    assert final["finish_reason"] in ("length", "stop", ["length"], ["stop"])


def counter(server, name: str, label: str) -> float:
    return sum(v for k, v in metric_values(scrape(server.metrics_url), name).items() if label in k)


def wait_for(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def routed_inputs(prompt: str, max_tokens: int) -> dict:
    """The scheduler's own inputs, as the router step would fill them."""
    return {
        **stream_inputs([prompt], max_tokens),
        "routed_task": np.array([b"infobench"], dtype=np.object_),
        "route_error": np.array([b""], dtype=np.object_),
    }


def test_cancelling_a_running_stream_leaves_the_rest_of_the_batch_running(server):
    # Triton 2.51 does not pass a client's cancellation on to the steps of an ensemble,
    # so the stream goes to the scheduler model itself, which is where it is handled.
    cancelled_before = counter(server, "specbatch_prompts_total", 'finish_reason="cancelled"')
    survivor = GrpcStream(server.grpc_url)
    victim = GrpcStream(server.grpc_url)
    try:
        survivor.send("keep", routed_inputs(LONG[0], 200), model="scheduler")
        victim.send("drop", routed_inputs(LONG[1], 400), model="scheduler")
        _, outputs, final, error = victim.next()
        assert error is None and not final
        started = time.monotonic()
        victim.close(cancel=True)
        assert wait_for(
            lambda: counter(server, "specbatch_prompts_total", 'finish_reason="cancelled"') > cancelled_before
        ), "the server never noticed the cancellation"
        noticed = time.monotonic() - started
        while True:
            _, outputs, final, error = survivor.next()
            if final:
                break
    finally:
        survivor.close()
    assert error is None
    assert outputs["finish_reason"] == ["length"] and outputs["num_output_tokens"] == [200]
    assert noticed < 5.0


def test_a_prompt_whose_deadline_cannot_be_met_is_failed_without_running(server):
    def shed() -> float:
        return sum(metric_values(scrape(server.metrics_url), "specbatch_shed_prompts_total").values())

    before = shed()
    late = GrpcStream(server.grpc_url)
    try:
        # a few hundred predicted tokens cannot come within 20 ms
        late.send("late", stream_inputs([INFOBENCH_PROMPT], 300), timeout_us=20_000)
        _, _, final, error = late.next(timeout_s=60)
    finally:
        late.close()
    assert final and error is not None and "deadline" in error
    assert shed() == before + 1


def test_a_task_the_client_makes_up_is_refused_and_counted_as_unknown(server):
    # Every label set a metric is given lives as long as the server: a client naming
    # a new task with each request must not grow them.
    made_up = "no-such-task-3f9c"
    errors_before = counter(server, "specbatch_prompt_errors_total", 'task="unknown"')
    direct = GrpcStream(server.grpc_url)
    try:
        inputs = routed_inputs(INFOBENCH_PROMPT, 8)
        inputs["routed_task"] = np.array([made_up.encode()], dtype=np.object_)
        direct.send("made-up", inputs, model="scheduler")
        messages, final = [], False
        while not final:
            _, outputs, final, error = direct.next(timeout_s=60)
            messages += [error] if error else [text for text in outputs.get("error", []) if text]
    finally:
        direct.close()
    assert any(f"no handler for task {made_up!r}" in message for message in messages), messages
    assert wait_for(
        lambda: counter(server, "specbatch_prompt_errors_total", 'task="unknown"') > errors_before
    ), "the refusal was never counted"
    assert made_up not in scrape(server.metrics_url)
