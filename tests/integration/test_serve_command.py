"""`specbatch serve` brings up tritonserver, the HTTP gateway and the OpenAI front
together, on loopback unless told otherwise; brings back whichever of its processes
dies; refuses ports in use by name; and stops everything on SIGINT."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as AnswerTimeout
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from helpers import (
    GRAPH_ANSWER,
    GRAPH_PROMPT,
    INFOBENCH_PROMPT,
    descendants,
    final_answers,
    long_requests_on_a_stream,
    post_generate,
    running_rows,
    stub_pid,
)

from specbatch.server.ports import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# /proc/net/tcp{,6} local addresses of 127.0.0.1, ::ffff:127.0.0.1 and ::1.
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}
BACK_S = 90  # a helper, router or scheduler is back well within this; tritonserver too


def listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as the kernel prints them) of every socket listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def children(parent: int) -> dict[int, str]:
    """{pid: command line} of the processes whose parent is ``parent``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == parent:
                    found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, IndexError, ValueError):
                continue
    return found


def child(parent: int, marker: str) -> int:
    [pid] = [pid for pid, command in children(parent).items() if marker in command]
    return pid


@dataclass
class Served:
    process: subprocess.Popen
    http: int
    grpc: int
    metrics: int
    front: int
    banner: list[str]
    log: Path

    def log_tail(self, lines: int = 60) -> str:
        return "".join(self.log.read_text().splitlines(keepends=True)[-lines:])

    def completion(self) -> str:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.front}/v1", api_key="unused", max_retries=0)
        return client.completions.create(model="specbatch", prompt=GRAPH_PROMPT, max_tokens=8).choices[0].text

    def long_completion(self) -> tuple[int, str]:
        """(HTTP status, body) of a long completion through the OpenAI front."""
        body = json.dumps({"model": "specbatch", "prompt": INFOBENCH_PROMPT, "max_tokens": 400}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.front}/v1/completions", data=body)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=120) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def generate(self, max_tokens: int) -> tuple[int, str]:
        return post_generate(f"127.0.0.1:{self.http}", max_tokens)

    def running_rows(self) -> float:
        return running_rows(f"http://127.0.0.1:{self.metrics}/metrics")

    def triton(self) -> int:
        return child(self.process.pid, "tritonserver")


def serve_command(http: int, grpc: int, metrics: int, front: int) -> list[str]:
    return [
        sys.executable, "-m", "specbatch.cli", "serve", "--config=cpu",
        f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}", f"--openai-port={front}",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def served(tiny_pair_dir, tmp_path_factory) -> Iterator[Served]:
    """The pipeline under `specbatch serve`; everything it prints is kept in serve.log
    (the path is printed), for a failure to be read against."""
    ports = [free_port() for _ in range(4)]
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    print(f"specbatch serve log: {log}")
    process = subprocess.Popen(
        serve_command(*ports), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: queue.Queue = queue.Queue()

    def drain() -> None:
        with log.open("w") as kept:
            for line in process.stdout:
                kept.write(line)
                kept.flush()
                lines.put(line)
        lines.put(None)

    threading.Thread(target=drain, daemon=True).start()
    seen = []
    try:
        while (line := lines.get(timeout=300)) is not None and "specbatch is ready" not in line:
            seen.append(line)
        assert line is not None, "".join(seen[-30:])
        yield Served(process, *ports, banner=[lines.get(timeout=10) for _ in range(5)], log=log)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGINT)
        process.wait(timeout=120)


def until_back(served: Served, what: str) -> float:
    """Seconds until a completion through the OpenAI front and a `/generate` through the
    gateway both succeed again."""
    started = time.monotonic()
    while time.monotonic() - started < BACK_S:
        try:
            if served.completion() == GRAPH_ANSWER and served.generate(4)[0] == 200:
                return time.monotonic() - started
        except (openai.APIError, OSError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"not serving {BACK_S} s after {what}")


def test_serve_starts_the_gateway_and_the_openai_front_beside_the_server(served):
    assert any(f":{served.front}/v1" in line for line in served.banner), served.banner
    assert served.completion() == GRAPH_ANSWER
    for port in (served.http, served.grpc, served.metrics, served.front):
        addresses = listening_addresses(port)
        assert addresses and addresses <= LOOPBACK, (port, addresses)


def test_a_second_serve_on_the_same_ports_names_the_port_and_starts_nothing(served):
    before = children(os.getpid())
    ports = (served.http, free_port(), free_port(), free_port())
    second = subprocess.run(serve_command(*ports), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert second.returncode == 1
    assert f"the HTTP port {served.http} on 127.0.0.1 is in use" in second.stderr, second.stderr
    assert children(os.getpid()).keys() <= before.keys() | {served.process.pid}


@pytest.mark.parametrize("marker", ["specbatch.openai", "specbatch.gateway"])
def test_a_killed_helper_process_is_started_again(served, marker):
    os.kill(child(served.process.pid, marker), signal.SIGKILL)
    until_back(served, f"killing {marker}")


@pytest.mark.parametrize("stub", ["router_0_0", "scheduler_0_0"])
def test_a_killed_router_or_scheduler_is_brought_back_and_what_it_held_is_answered(served, stub):
    """Requests waiting on the scheduler when it dies are answered (503, retry) within
    seconds, never left to the client's timeout; the step is back within a minute."""
    stream = long_requests_on_a_stream(f"127.0.0.1:{served.grpc}", 2)
    with ThreadPoolExecutor(6) as pool:
        pending = [pool.submit(served.generate, 400) for _ in range(4)]
        pending += [pool.submit(served.long_completion) for _ in range(2)]
        deadline = time.monotonic() + 60
        while served.running_rows() < 2:
            assert time.monotonic() < deadline, "the requests never started"
            time.sleep(0.05)
        killed = time.monotonic()
        os.kill(stub_pid(served.triton(), stub), signal.SIGKILL)
        try:
            answers = [future.result(timeout=60) for future in pending]
            streamed = final_answers(stream, 2, timeout_s=60)
        except (AnswerTimeout, queue.Empty) as unanswered:
            raise AssertionError(f"left unanswered\n{served.log_tail()}") from unanswered
        answered_s = time.monotonic() - killed
    stream.close()
    assert answered_s < 20, answered_s
    for status, body in answers:
        assert status == 200 or (status == 503 and "retry" in body), (status, body)
    assert all(error is None or "retry" in error for error in streamed), streamed
    if stub.startswith("scheduler"):
        failed = [status for status, _ in answers if status == 503] + [e for e in streamed if e]
        assert failed, "rows were running on the scheduler's behalf"
    until_back(served, f"killing {stub}")
    status, body = served.generate(8)
    assert status == 200, body


def test_a_killed_tritonserver_is_started_again(served):
    os.kill(served.triton(), signal.SIGKILL)
    until_back(served, "killing tritonserver")


def test_sigint_stops_every_process(served):
    pids = [served.process.pid, *descendants(served.process.pid)]
    assert len(pids) >= 10, pids  # launcher, tritonserver, gateway, front, four stubs, solver workers
    os.kill(served.process.pid, signal.SIGINT)
    assert served.process.wait(timeout=120) == 0
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
