"""`specbatch serve` brings up tritonserver and the OpenAI front together, on loopback unless
told otherwise, and stops both."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import openai
import pytest
from helpers import GRAPH_ANSWER, GRAPH_PROMPT

from specbatch.server.process import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# /proc/net/tcp{,6} local addresses of 127.0.0.1, ::ffff:127.0.0.1 and ::1.
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


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


def test_serve_starts_the_openai_front_beside_the_server(tiny_pair_dir):
    http, grpc, metrics, front = (free_port() for _ in range(4))
    command = [
        sys.executable, "-m", "specbatch.cli", "serve", "--config=cpu",
        f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}", f"--openai-port={front}",
    ]  # fmt: skip
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()

    def drain() -> None:
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=drain, daemon=True).start()
    seen = []
    try:
        while (line := lines.get(timeout=300)) is not None and "specbatch is ready" not in line:
            seen.append(line)
        assert line is not None, "".join(seen[-30:])
        banner = [lines.get(timeout=10) for _ in range(4)]
        assert any(f":{front}/v1" in b for b in banner), banner
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{front}/v1", api_key="unused", max_retries=0)
        reply = client.completions.create(model="specbatch", prompt=GRAPH_PROMPT, max_tokens=8)
        assert reply.choices[0].text == GRAPH_ANSWER
        for port in (http, grpc, metrics, front):
            addresses = listening_addresses(port)
            assert addresses and addresses <= LOOPBACK, (port, addresses)
    finally:
        os.kill(process.pid, signal.SIGINT)
        code = process.wait(timeout=120)
    assert code == 0
