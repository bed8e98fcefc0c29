"""A real tritonserver with the whole pipeline (cpu config, tiny pair) on free loopback ports,
and the OpenAI-compatible front in front of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from specbatch.server.openai_process import OpenAIFrontProcess
from specbatch.server.process import Ports, ServerOptions, TritonProcess, free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def server(tiny_pair_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    # A fixed K, so every generated prompt speculates and its counters can be checked;
    # the default (goodput) may choose plain decoding, which the unit tests cover.
    options = ServerOptions(
        root=ROOT,
        config_name="cpu",
        ports=Ports.free(),
        host="127.0.0.1",
        exit_timeout_s=10,
        env={"SPECBATCH_LOOKAHEAD": "3", "SPECBATCH_FAULT_INJECTION": "1"},
    )
    process = TritonProcess(options)
    log = tmp_path_factory.mktemp("triton") / "server.log"
    process.start(log)
    try:
        process.wait_ready(timeout_s=300)
        yield process
    finally:
        process.stop()
        print(f"tritonserver log: {log}")


@pytest.fixture(scope="session")
def openai_front(
    server: TritonProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OpenAIFrontProcess]:
    """The OpenAI-compatible front forwarding to the session's server."""
    front = OpenAIFrontProcess(server.grpc_url, free_port(), "127.0.0.1")
    front.start(tmp_path_factory.mktemp("openai") / "front.log")
    try:
        front.wait_ready()
        yield front
    finally:
        front.stop()
