"""A real tritonserver with the whole pipeline (cpu config, tiny pair) on free loopback ports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from specbatch.server.process import Ports, ServerOptions, TritonProcess

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
        env={"SPECBATCH_LOOKAHEAD": "3"},
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
