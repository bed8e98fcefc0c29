"""Injected faults on a real tritonserver: every request still gets exactly one final answer.

The session server runs with SPECBATCH_FAULT_INJECTION=1, so a prompt carrying
``[[fault:scheduler]]``, ``[[fault:instance]]`` or ``[[fault:reply]]`` makes that part of
the server raise (see specbatch.serving.faults).
"""

from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import INFOBENCH_PROMPT, metric_values, running_server, scrape
from specbatch_client import GenerationOptions, ServerError, SpecbatchClient

pytestmark = pytest.mark.integration

SHORT = GenerationOptions(max_tokens=8)


def ask(server, prompt: str, options: GenerationOptions = SHORT):
    """(answer, None) or (None, the server's error message)."""
    try:
        return SpecbatchClient(server.http_url).generate([prompt], options)[0], None
    except ServerError as exc:
        return None, str(exc)


def counter(server, name: str) -> float:
    return sum(metric_values(scrape(server.metrics_url), name).values())


def test_a_scheduler_loop_failure_answers_what_it_held_and_the_loop_goes_on(server):
    restarts = counter(server, "specbatch_scheduler_restarts_total")
    answer, error = ask(server, INFOBENCH_PROMPT + " [[fault:scheduler]]")
    assert answer is None and "scheduler failed" in error
    assert counter(server, "specbatch_scheduler_restarts_total") == restarts + 1
    answer, error = ask(server, INFOBENCH_PROMPT)
    assert error is None and answer.num_output_tokens > 0


def test_an_instance_step_failure_fails_its_rows_and_the_instance_serves_on(server):
    answer, error = ask(server, INFOBENCH_PROMPT + " [[fault:instance]]")
    assert answer is None and "injected instance fault" in error
    with ThreadPoolExecutor(4) as pool:
        after = list(pool.map(lambda _: ask(server, INFOBENCH_PROMPT), range(4)))
    assert all(error is None for _, error in after), after
    assert {a.model_instance for a, _ in after} <= {"qwen3_specdec_0_0", "qwen3_specdec_0_1"}


def test_a_reply_that_cannot_be_built_is_answered_with_the_error(server):
    answer, error = ask(server, INFOBENCH_PROMPT + " [[fault:reply]]")
    assert answer is None and "failed to answer" in error


def test_sigterm_with_requests_in_flight_answers_them_and_exits_within_the_timeout(
    tiny_pair_dir: Path, tmp_path: Path
):
    with running_server(tmp_path / "server.log", {}, exit_timeout_s=15) as process:
        client = SpecbatchClient(process.http_url)
        client.generate([INFOBENCH_PROMPT], SHORT)  # warm
        started = threading.Barrier(5)

        def long_request(_):
            started.wait()
            try:
                return client.generate([INFOBENCH_PROMPT], GenerationOptions(max_tokens=96))[0], None
            except Exception as exc:
                return None, str(exc)

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(long_request, i) for i in range(4)]
            started.wait()
            process.process.send_signal(signal.SIGTERM)
            results = [future.result(timeout=120) for future in futures]
        returncode = process.process.wait(timeout=15 + 15)
    assert returncode is not None
    for answer, error in results:
        # served in full, or refused/answered as the server stopped: never left hanging
        assert (error is None and answer.num_output_tokens > 0) or error, (answer, error)
