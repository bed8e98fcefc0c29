"""A real tritonserver with the whole pipeline (cpu config, tiny pair) on free loopback ports,
and the OpenAI-compatible front in front of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import PATIENT_SLA, running_server

from specbatch.server.children import OpenAIFrontProcess
from specbatch.server.ports import free_port
from specbatch.server.process import TritonProcess


@pytest.fixture(scope="session")
def server(tiny_pair_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    # A fixed K, so every generated prompt speculates and its counters can be checked;
    # the default (goodput) may choose plain decoding, which the unit tests cover.
    env = {"SPECBATCH_LOOKAHEAD": "3", "SPECBATCH_FAULT_INJECTION": "1", **PATIENT_SLA}
    with running_server(tmp_path_factory.mktemp("triton") / "server.log", env) as process:
        yield process


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
