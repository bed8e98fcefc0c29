"""The README's curl and Python examples, run as written against a real server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.DOTALL)


def on_server(code: str, server) -> str:
    return code.replace("localhost:8000", server.http_url).replace("localhost:8001", server.grpc_url)


def run_bash(code: str) -> str:
    reply = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=300)
    assert reply.returncode == 0, reply.stderr
    return reply.stdout


def test_readme_curl_examples(server):
    generate, stream = [on_server(b, server) for b in code_blocks("bash") if b.lstrip().startswith("curl")]
    body = json.loads(run_bash(generate))
    assert body["task"] == ["infobench", "mmlu"]
    assert body["text_output"][0] and re.fullmatch(r"The answer is \([ABC]\)", body["text_output"][1])

    events = [json.loads(line[6:]) for line in run_bash(stream).splitlines() if line.startswith("data: ")]
    assert len(events) > 2
    assert events[-1]["finish_reason"] in ("length", "stop")
    assert "".join(e["text_output"] for e in events[:-1])


@pytest.mark.parametrize("marker", ["specbatch_client", "tritonclient.grpc"])
def test_readme_python_examples(server, marker):
    [example] = [b for b in code_blocks("python") if f"import {marker}" in b or f"from {marker}" in b]
    reply = subprocess.run(
        [sys.executable, "-c", on_server(example, server)], capture_output=True, text=True, timeout=300
    )
    assert reply.returncode == 0, reply.stderr
    assert "infobench" in reply.stdout
