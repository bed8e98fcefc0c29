"""Addressed instances on a real tritonserver: who ran a prompt, overload, and instances
killed outright under load and brought back.

Its own server: two rows per instance and a queue of four make overload easy to reach,
and its instances are killed (one, then both) and hung, so those tests run last.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from helpers import INFOBENCH_PROMPT, GrpcStream, metric_values, running_server, scrape
from specbatch_client import GenerationOptions, ServerError, SpecbatchClient

from specbatch.server.process import TritonProcess

pytestmark = pytest.mark.integration

LONG = GenerationOptions(max_tokens=160, temperature=0.0)
INSTANCES = {"qwen3_specdec_0_0", "qwen3_specdec_0_1"}
RESTART_S = 60  # the bound the reliability issue sets for an instance to be back


def ready(server: TritonProcess) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=5) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def metric(server: TritonProcess, name: str) -> float:
    return sum(metric_values(scrape(server.metrics_url), name).values())


def until(predicate, what: str, timeout_s: float = RESTART_S) -> None:
    """Poll an observable of the server (readiness, a metric) until it holds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def both_instances_serve(server: TritonProcess) -> bool:
    with ThreadPoolExecutor(4) as pool:
        answers = list(
            pool.map(lambda _: generate(server, options=GenerationOptions(max_tokens=24)), range(4))
        )
    assert all(error is None for _, error in answers), answers
    return {answer.model_instance for answer, _ in answers} == INSTANCES


@pytest.fixture(scope="module")
def small_server(tiny_pair_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    env = {
        "SPECBATCH_BATCH_SIZE_MAX": "2",
        "SPECBATCH_QUEUE_LIMIT": "4",
        "SPECBATCH_QUEUE_MIN": "4",
        "SPECBATCH_MAX_TOKENS_CAP": "512",
        "SPECBATCH_FAULT_INJECTION": "1",
        "SPECBATCH_INSTANCE_HANG_MS": "5000",
    }
    with running_server(tmp_path_factory.mktemp("triton-instances") / "server.log", env) as process:
        yield process


def generate(server: TritonProcess, prompt: str = INFOBENCH_PROMPT, options: GenerationOptions = LONG):
    """(answer, None) or (None, the server's refusal)."""
    try:
        return SpecbatchClient(server.http_url).generate([prompt], options)[0], None
    except ServerError as exc:
        return None, str(exc)


def test_every_answer_names_its_instance_and_both_instances_serve(small_server):
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: generate(small_server), range(4)))
    answers = [answer for answer, error in results if error is None]
    assert len(answers) == 4, results
    assert {a.model_instance for a in answers} == INSTANCES


def test_the_load_gauges_read_idle_once_every_answer_is_in(small_server):
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(lambda _: generate(small_server, options=GenerationOptions(max_tokens=24)), range(4))
        )
    assert all(error is None for _, error in results), results
    # the last load an instance reports before going quiet is published too
    until(
        lambda: metric(small_server, "specbatch_running_rows") == 0, "the running-rows gauges to read 0", 10
    )


def test_over_the_queue_bound_requests_are_refused_at_once_and_admitted_ones_complete(small_server):
    # 2 instances x 2 rows run, 4 wait: of 14 sent at once, at least 6 are refused
    with ThreadPoolExecutor(14) as pool:
        results = list(pool.map(lambda _: generate(small_server), range(14)))
    refused = [error for answer, error in results if error is not None]
    served = [answer for answer, error in results if error is None]
    assert len(refused) >= 6
    assert all("overloaded" in error for error in refused)
    assert len(served) == 14 - len(refused)
    assert all(a.error == "" and a.num_output_tokens > 0 for a in served)


def post(server: TritonProcess, path: str) -> tuple[int, str, str | None]:
    """(HTTP status, body, Retry-After) of one plain JSON POST to the ensemble."""
    body = json.dumps({"text_input": [INFOBENCH_PROMPT], "max_tokens": 160}).encode()
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/specbatch/{path}", data=body)
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, reply.read().decode(), reply.headers.get("Retry-After")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), exc.headers.get("Retry-After")


@pytest.mark.parametrize("path", ["generate", "generate_stream"])
def test_an_overload_refusal_is_http_503_with_retry_after(small_server, path):
    with ThreadPoolExecutor(14) as pool:
        results = list(pool.map(lambda _: post(small_server, path), range(14)))
    refused = [(status, body, retry) for status, body, retry in results if status != 200]
    assert len(refused) >= 6, results
    assert all(status == 503 and retry == "1" and "overloaded" in body for status, body, retry in refused), (
        refused
    )


def running_on(server: TritonProcess, instance: str) -> float:
    rows = metric_values(scrape(server.metrics_url), "specbatch_running_rows")
    return sum(value for labels, value in rows.items() if f'instance="{instance}"' in labels)


def test_an_instance_killed_under_load_loses_no_request_and_is_back_within_a_minute(small_server):
    victim = "qwen3_specdec_0_1"
    requeued = metric(small_server, "specbatch_requeued_prompts_total")
    stream = GrpcStream(small_server.grpc_url)
    streamed_text = threading.Event()
    try:
        # one streaming request: once its text has reached the client it cannot be re-run
        stream.send(
            "streamed",
            {
                "text_input": np.array([INFOBENCH_PROMPT.encode()], dtype=np.object_),
                "max_tokens": np.array([400], dtype=np.int32),
                "stream": np.array([True]),
            },
        )
        with ThreadPoolExecutor(3) as pool:
            running = [pool.submit(generate, small_server) for _ in range(3)]
            responses = []
            while not streamed_text.is_set():
                _, outputs, final, error = stream.next()
                responses.append((outputs, final, error))
                if outputs.get("text_output", [""])[0]:
                    streamed_text.set()
            # four rows on two instances of two rows each: the victim is running some
            until(lambda: running_on(small_server, victim) >= 1, f"{victim} to run rows", 30)
            os.kill(small_server.stub_pids()[victim], signal.SIGKILL)
            results = [future.result(timeout=300) for future in running]
        while not responses[-1][1]:
            _, outputs, final, error = stream.next()
            responses.append((outputs, final, error))
    finally:
        stream.close()

    # the non-streamed prompts were re-run where needed: every one is answered, none lost
    assert all(error is None and answer.error == "" for answer, error in results), results
    outputs, final, error = responses[-1]
    if error is not None:
        assert victim in error
    else:
        assert outputs["model_instance"] == ["qwen3_specdec_0_0"]
    # what the victim ran and had not streamed was re-run (counted before its answer)
    assert metric(small_server, "specbatch_requeued_prompts_total") >= requeued + 1
    # the survivor kept serving, so the server stayed ready; the model is reloaded and
    # both instances serve again, the restart counted
    assert ready(small_server)
    assert small_server.supervisor.wait_for_restarts(1, RESTART_S)
    until(lambda: metric(small_server, "specbatch_instances_serving") == 2, "both instances to connect")
    assert metric(small_server, "specbatch_instance_restarts_total") == 1
    assert metric(small_server, "specbatch_instance_failures_total") == 1
    until(lambda: both_instances_serve(small_server), "both instances to serve")


def test_with_every_instance_killed_the_server_is_not_ready_until_they_are_back(small_server):
    restarts = small_server.supervisor.restarts
    for name, pid in small_server.stub_pids().items():
        if name in INSTANCES:
            os.kill(pid, signal.SIGKILL)
    until(lambda: not ready(small_server), "readiness to drop")
    # Readiness drops when the supervisor starts bringing them back, which may come before
    # the scheduler has read both deaths off their sockets: a prompt given to an instance
    # whose death it has not read yet is re-run once and then failed, as it should be.
    until(lambda: metric(small_server, "specbatch_instances_serving") == 0, "the scheduler to see both gone")
    # a request sent while nothing can serve waits in the queue and is served once they are back
    answer, error = generate(small_server, options=GenerationOptions(max_tokens=8))
    assert error is None and answer.error == "" and answer.model_instance in INSTANCES, (answer, error)
    assert small_server.supervisor.wait_for_restarts(restarts + 1, RESTART_S)
    until(lambda: ready(small_server), "readiness to return")
    until(lambda: both_instances_serve(small_server), "both instances to serve")


def test_a_hung_instance_is_ended_and_replaced_and_its_prompt_answered_once(small_server):
    restarts = small_server.supervisor.restarts
    failures = metric(small_server, "specbatch_instance_failures_total")
    answer, error = generate(
        small_server, INFOBENCH_PROMPT + " [[fault:hang]]", GenerationOptions(max_tokens=16)
    )
    # re-run once elsewhere (nothing was streamed), where it hangs that instance too: an error
    assert answer is None and "failed while running this prompt" in error, (answer, error)
    assert metric(small_server, "specbatch_instance_failures_total") == failures + 2
    assert small_server.supervisor.wait_for_restarts(restarts + 1, RESTART_S)
    until(lambda: both_instances_serve(small_server), "both instances to serve")
