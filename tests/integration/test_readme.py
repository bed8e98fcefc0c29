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


def test_readme_curl_example(server):
    [curl] = [b for b in code_blocks("bash") if b.lstrip().startswith("curl")]
    reply = subprocess.run(
        ["bash", "-c", on_server(curl, server)], capture_output=True, text=True, timeout=300
    )
    assert reply.returncode == 0, reply.stderr
    body = json.loads(reply.stdout)
    assert body["task"] == ["infobench", "mmlu"]
    assert body["text_output"][0] and re.fullmatch(r"The answer is \([ABC]\)", body["text_output"][1])


@pytest.mark.parametrize("marker", ["specbatch_client", "tritonclient.grpc"])
def test_readme_python_examples(server, marker):
    [example] = [b for b in code_blocks("python") if f"import {marker}" in b or f"from {marker}" in b]
    reply = subprocess.run(
        [sys.executable, "-c", on_server(example, server)], capture_output=True, text=True, timeout=300
    )
    assert reply.returncode == 0, reply.stderr
    assert "infobench" in reply.stdout
