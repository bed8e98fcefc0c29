"""Injected faults on a real tritonserver: every request still gets exactly one final answer.

The session server runs with SPECBATCH_FAULT_INJECTION=1, so a prompt carrying
``[[fault:scheduler]]``, ``[[fault:instance]]`` or ``[[fault:reply]]`` makes that part of
the server raise (see specbatch.serving.faults).
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import INFOBENCH_PROMPT, PATIENT_SLA, metric_values, running_server, scrape
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
    """One row per instance: of six requests two run and the others wait when SIGTERM
    comes. Triton stops taking requests and waits for those in flight; each is served in
    full or answered with the shutdown error, and the server exits cleanly inside its exit
    timeout (an expired timeout exits with an error status and drops what is left). The
    running rows are held on their first step (each instance says when it holds one) until
    the signal has been sent, so the state the signal meets does not depend on how fast the
    machine runs."""
    exit_timeout_s = 20
    release = tmp_path / "release"
    env = {
        "SPECBATCH_BATCH_SIZE_MAX": "1",
        "SPECBATCH_QUEUE_MIN": "8",
        "SPECBATCH_FAULT_INJECTION": "1",
        "SPECBATCH_FAULT_RELEASE": str(release),
        **PATIENT_SLA,
    }
    with running_server(tmp_path / "server.log", env, exit_timeout_s=exit_timeout_s) as process:
        client = SpecbatchClient(process.http_url)
        client.generate([INFOBENCH_PROMPT], SHORT)  # warm

        def held_request(_):
            try:
                prompt = INFOBENCH_PROMPT + " [[fault:hold]]"
                return client.generate([prompt], GenerationOptions(max_tokens=48))[0], None
            except Exception as exc:
                return None, str(exc)

        def two_held_and_others_waiting() -> bool:
            held = len(list(tmp_path.glob(f"{release.name}.held.*")))
            return held == 2 and counter(process, "specbatch_queue_depth") >= 1

        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(held_request, i) for i in range(6)]
            deadline = time.monotonic() + 120
            while not two_held_and_others_waiting():
                assert time.monotonic() < deadline, "two rows never ran with others waiting"
                time.sleep(0.05)
            process.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            release.touch()
            returncode = process.process.wait(timeout=exit_timeout_s + 15)
            exited_after_s = time.monotonic() - signalled
            results = [future.result(timeout=30) for future in futures]
    assert returncode == 0 and exited_after_s < exit_timeout_s, (returncode, exited_after_s)
    for answer, error in results:
        served = error is None and answer.error == "" and answer.finish_reason in ("length", "stop")
        assert served or "shutting down" in error, (answer, error)
