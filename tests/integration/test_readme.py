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


def on_server(code: str, server, front=None) -> str:
    code = code.replace("localhost:8000", server.http_url).replace("localhost:8001", server.grpc_url)
    return code.replace("localhost:9000", front.url.removeprefix("http://")) if front else code


def curl_block(path: str) -> str:
    """The README's one curl example calling `path` (followed by a space or a quote)."""
    [block] = [
        b for b in code_blocks("bash") if b.lstrip().startswith("curl") and re.search(rf"{path}[ ']", b)
    ]
    return block


def run_bash(code: str) -> str:
    reply = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=300)
    assert reply.returncode == 0, reply.stderr
    return reply.stdout


def test_readme_curl_examples(server):
    generate = on_server(curl_block("/generate"), server)
    stream = on_server(curl_block("/generate_stream"), server)
    body = json.loads(run_bash(generate))
    assert body["task"] == ["infobench", "mmlu"]
    assert body["text_output"][0] and re.fullmatch(r"The answer is \([ABC]\)", body["text_output"][1])

    events = [json.loads(line[6:]) for line in run_bash(stream).splitlines() if line.startswith("data: ")]
    assert len(events) > 2
    assert events[-1]["finish_reason"] in ("length", "stop")
    assert "".join(e["text_output"] for e in events[:-1])


def test_readme_openai_curl_examples(server, openai_front):
    chat = json.loads(run_bash(on_server(curl_block("/v1/chat/completions"), server, openai_front)))
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["content"]
    assert chat["usage"]["prompt_tokens"] > 0

    lines = run_bash(on_server(curl_block("/v1/completions"), server, openai_front)).splitlines()
    events = [line[6:] for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = {0: "", 1: ""}
    for chunk in chunks[:-1]:
        texts[chunk["choices"][0]["index"]] += chunk["choices"][0]["text"]
    assert texts[0] and re.fullmatch(r"The answer is \([ABC]\)", texts[1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def test_readme_openai_python_example(server, openai_front):
    [example] = [b for b in code_blocks("python") if "from openai import" in b]
    reply = subprocess.run(
        [sys.executable, "-c", on_server(example, server, openai_front)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert reply.returncode == 0, reply.stderr
    assert re.match(r"The answer is \([ABC]\) CompletionUsage", reply.stdout)
    assert len(reply.stdout.splitlines()) >= 2


@pytest.mark.parametrize("marker", ["specbatch_client", "tritonclient.grpc"])
def test_readme_python_examples(server, marker):
    [example] = [b for b in code_blocks("python") if f"import {marker}" in b or f"from {marker}" in b]
    reply = subprocess.run(
        [sys.executable, "-c", on_server(example, server)], capture_output=True, text=True, timeout=300
    )
    assert reply.returncode == 0, reply.stderr
    assert "infobench" in reply.stdout
