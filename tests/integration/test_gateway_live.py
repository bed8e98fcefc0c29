"""No request body takes the server down: Triton 2.51 dies on a body over about 4 MiB,
so every HTTP port a user reaches answers such a body with 413 (the gateway in front
of Triton's HTTP and metrics ports, the OpenAI front), and the server goes on serving;
and a body Triton cannot parse, which it answers 500, is the client's 400."""

from __future__ import annotations

import urllib.error
import urllib.request

import numpy as np
import pytest
from helpers import INFOBENCH_PROMPT, grpc_generate
from specbatch_client import GenerationOptions, SpecbatchClient

pytestmark = pytest.mark.integration

SIZES = (8 * 1024 * 1024, 64 * 1024 * 1024)


def post(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def still_serving(server) -> None:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=10) as reply:
        assert reply.status == 200
    [answer] = SpecbatchClient(server.http_url).generate([INFOBENCH_PROMPT], GenerationOptions(max_tokens=4))
    assert answer.error == "" and answer.num_output_tokens == 4


@pytest.mark.parametrize("size", SIZES, ids=["8MB", "64MB"])
def test_a_huge_body_to_any_http_endpoint_is_refused_and_the_server_stays_up(server, openai_front, size):
    prompt = b'{"text_input": ["' + b"a" * size + b'"], "max_tokens": 4}'
    endpoints = [
        f"http://{server.http_url}/v2/models/specbatch/generate",
        f"http://{server.http_url}/v2/models/specbatch/generate_stream",
        f"http://{server.http_url}/v2/models/router/infer",
        f"http://{server.http_url}/v2/health/ready",
        server.metrics_url,
        f"{openai_front.url}/v1/completions",
        f"{openai_front.url}/v1/chat/completions",
    ]
    # the fronts read a refused body to its end (aiohttp's lingering close) before they
    # close, so the client reads its 413: a closed connection is a failure here
    statuses = {url: post(url, prompt) for url in endpoints}
    assert set(statuses.values()) == {413}, statuses
    still_serving(server)


def test_a_huge_prompt_over_grpc_is_a_clear_error_and_the_server_stays_up(server):
    prompts = np.array([b"a" * SIZES[0]], dtype=np.object_)
    outputs, error = grpc_generate(server.grpc_url, {"text_input": prompts})
    assert outputs == {} and error is not None and "at most 1048576" in error, (outputs, error)
    still_serving(server)


def test_a_body_triton_cannot_parse_is_a_400_over_http(server):
    bodies = (b'{"text_input": ["hi"], "max_tokens": "8"}', b'{"text_input": ')
    for path in ("generate", "generate_stream"):
        url = f"http://{server.http_url}/v2/models/specbatch/{path}"
        assert [post(url, body) for body in bodies] == [400, 400], path
    still_serving(server)
