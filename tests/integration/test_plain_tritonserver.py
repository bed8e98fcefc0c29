"""The pipeline as deploy/ runs it: plain tritonserver, no launcher watching it, and what
the pod ships bringing back whatever stub process dies (scheduler, router, a decoding
instance): in the Kubernetes pod the gateway beside it (`--supervise`, the pod's shared
process namespace), in the KServe pod `specbatch watch` in tritonserver's own container,
telling the gateway of a dead scheduler on its loopback control port. What a dead
scheduler held is answered within seconds; a request meanwhile gets 503, never a 4xx."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import (
    descendants,
    final_answers,
    is_ready,
    long_requests_on_a_stream,
    post_generate,
    running_rows,
    running_server,
    stub_pid,
)

from specbatch.server.process import TritonProcess

pytestmark = pytest.mark.integration

HONEST_S = 5  # readiness says a dead step cannot serve
BACK_S = 30  # router and scheduler
FULL_CAPACITY_S = 60  # a decoding instance (its model pair loads again)
INSTANCES = {"qwen3_specdec_0_0", "qwen3_specdec_0_1"}
CONTAINER_START_S = 300  # a restarted container: tritonserver and every model load again
# The container's main process killed by SIGABRT: tritonserver, or `specbatch watch`
# exiting with its status.
TRITON_ABORTED = {-signal.SIGABRT, 128 + signal.SIGABRT}


class Kubelet:
    """restartPolicy: Always for the container whose main process is ``server.process``:
    when it exits, it is started again (the gateway, in its own container, stays)."""

    def __init__(self, server: TritonProcess) -> None:
        self.server = server
        self.exits: list[int] = []
        self.restarted_at: float | None = None
        self._stopping = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._restart_on_exit, name="kubelet", daemon=True)
        self._thread.start()

    def _restart_on_exit(self) -> None:
        while True:
            code = self.server.process.wait()
            with self._lock:
                if self._stopping:
                    return
                self.exits.append(code)
                self.restarted_at = time.monotonic()
                self.server.restart_triton()

    def stop(self) -> None:
        """No restart after this returns (the server is then stopped, or killed, by the test)."""
        with self._lock:
            self._stopping = True

    def allowance(self, since: float, timeout_s: float) -> float:
        """Seconds from ``since``: ``timeout_s``, or if later, the time a container takes
        to start from the kubelet's last restart."""
        if self.restarted_at is None:
            return timeout_s
        return max(timeout_s, self.restarted_at + CONTAINER_START_S - since)


@pytest.fixture(scope="module", params=["kubernetes", "kserve"])
def pod(
    request: pytest.FixtureRequest, tiny_pair_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonProcess]:
    log = tmp_path_factory.mktemp(f"triton-{request.param}-pod") / "server.log"
    with running_server(log, {}, as_in_a_pod=request.param) as process:
        assert process.supervisor is None, "nothing but the pod's own processes watch this server"
        yield process


@pytest.fixture(scope="module")
def kubelet(pod: TritonProcess) -> Iterator[Kubelet]:
    kubelet = Kubelet(pod)
    try:
        yield kubelet
    finally:
        kubelet.stop()
    assert set(kubelet.exits) <= TRITON_ABORTED, f"tritonserver exited with {kubelet.exits}"


def until(
    server: TritonProcess, predicate, what: str, timeout_s: float, kubelet: Kubelet | None = None
) -> float:
    """Seconds until ``predicate()`` holds (polling an observable of ``server``); with
    ``kubelet``, a container it restarted meanwhile gets the time it takes to start. A
    timeout quotes what the pod's watchers logged: whether they saw the death at all."""
    started = time.monotonic()
    while not predicate():
        allowed_s = timeout_s if kubelet is None else kubelet.allowance(started, timeout_s)
        waited_s = time.monotonic() - started
        assert waited_s < allowed_s, f"timed out ({waited_s:.0f} s) for {what}\n{watchers_log(server)}"
        time.sleep(0.1)
    return time.monotonic() - started


def watchers_log(server: TritonProcess) -> str:
    """The lines the stub supervisor and the gateway wrote to the server's log."""
    lines = server.log_tail(lines=400).splitlines()
    return "\n".join(line for line in lines if "specbatch.server" in line or "specbatch.gateway:" in line)


def serves(server: TritonProcess) -> bool:
    return post_generate(server.http_url, 4)[0] == 200


def readiness_turns_honest(server: TritonProcess, what: str) -> float:
    """Seconds until `/v2/health/ready` says not ready, or a request is served again (the
    step came back between two looks). The requests run beside the readiness polls, not
    inside them: one waiting on the dead step must not hold the next look up. The poster
    ends with the request it has in flight."""
    served, stop = threading.Event(), threading.Event()

    def post_until_served() -> None:
        while not stop.is_set():
            if serves(server):
                served.set()
                return

    poster = threading.Thread(target=post_until_served, name="poster", daemon=True)
    poster.start()
    try:
        return until(server, lambda: served.is_set() or not is_ready(server.http_url), what, HONEST_S)
    finally:
        stop.set()


def test_a_killed_scheduler_s_requests_are_answered_and_it_is_back(pod, kubelet):
    """Over HTTP and on a gRPC stream (the gateway's relay answers what Triton never will)."""
    stream = long_requests_on_a_stream(pod.grpc_url, 2)
    with ThreadPoolExecutor(4) as pool:
        pending = [pool.submit(post_generate, pod.http_url, 400) for _ in range(4)]
        until(pod, lambda: running_rows(pod.metrics_url) >= 2, "rows to run", 60)
        killed = time.monotonic()
        os.kill(stub_pid(pod.server_pid, "scheduler_0_0"), signal.SIGKILL)
        readiness_turns_honest(pod, "readiness to say the scheduler is down")
        answers = [future.result(timeout=60) for future in pending]
        streamed = final_answers(stream, 2, timeout_s=60)
        answered_s = time.monotonic() - killed
    stream.close()  # returns: the relay ends a stream once nothing on it is owed
    assert answered_s < 20, answered_s
    assert all(status == 200 or (status == 503 and "retry" in body) for status, body in answers), answers
    assert all(error is None or "retry" in error for error in streamed), streamed
    failed = [status for status, _ in answers if status == 503] + [e for e in streamed if e is not None]
    assert failed, "rows were running on the dead scheduler's behalf"
    until(pod, lambda: serves(pod), "the scheduler to serve again", BACK_S, kubelet)


def test_a_killed_router_is_back_and_meanwhile_requests_get_503(pod, kubelet):
    os.kill(stub_pid(pod.server_pid, "router_0_0"), signal.SIGKILL)
    readiness_turns_honest(pod, "readiness to say the router is down")
    statuses = set()

    def back() -> bool:
        status, _ = post_generate(pod.http_url, 4)
        statuses.add(status)
        return status == 200

    until(pod, back, "the router to serve again", BACK_S, kubelet)
    assert statuses <= {200, 503}, statuses


def test_a_killed_instance_is_back_and_both_serve_again(pod, kubelet):
    os.kill(stub_pid(pod.server_pid, "qwen3_specdec_0_1"), signal.SIGKILL)

    def both_serve() -> bool:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: post_generate(pod.http_url, 24), range(4)))
        assert all(status in (200, 503) for status, _ in answers), answers
        return {json.loads(body)["model_instance"] for status, body in answers if status == 200} == INSTANCES

    until(pod, both_serve, "both instances to serve", FULL_CAPACITY_S, kubelet)


def test_a_killed_tritonserver_leaves_no_process_behind(pod, kubelet):
    """Runs last: the stubs' threads block for good in Triton's IPC once it is gone, so
    each stub has a watcher process that ends it."""
    kubelet.stop()
    below = descendants(pod.process.pid)
    assert len(below) >= 6, below  # four stubs, two solver workers, and their watchers
    os.kill(pod.server_pid, signal.SIGKILL)
    until(
        pod,
        lambda: not any(Path(f"/proc/{pid}").exists() for pid in below),
        "every process below it to exit",
        20,
    )
