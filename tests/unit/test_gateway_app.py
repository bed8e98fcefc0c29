"""The HTTP gateway: bodies past the limit never reach Triton, unavailability is a 503,
and everything else passes through unchanged, streams streamed. The upstream here is a
small aiohttp app answering as Triton 2.51 does; tests/integration/test_gateway_live.py runs
the gateway in front of the real server."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from specbatch.gateway import MAX_BODY_CEILING, build_app
from specbatch.gateway.app import HELD

OVERLOADED = "in ensemble 'specbatch', the server is overloaded: 9 prompts are queued (limit 8); retry later"
BAD_PROMPT = "in ensemble 'specbatch', text_input: a prompt is empty"
SEVERAL_RESPONSES = (
    "generate expects model to produce exactly 1 response, use generate stream for model that generates "
    "various number of responses"
)
SERVER_FAULT = "failed to allocate the output tensor"
NOT_JSON = "failed to parse the request JSON buffer: Invalid value. at 0"
UNPARSEABLE = "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"


def upstream_app(seen: list[int]) -> web.Application:
    async def generate(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append(len(body))
        try:
            parsed = json.loads(body)
        except ValueError:
            return web.json_response({"error": NOT_JSON}, status=500)
        if not isinstance(parsed.get("max_tokens", 0), int):
            return web.json_response({"error": UNPARSEABLE}, status=500)
        prompt = parsed["text_input"][0]
        if prompt == "held":  # a dead scheduler never answers
            await asyncio.Event().wait()
        if prompt == "overload":
            return web.json_response({"error": OVERLOADED}, status=400)
        if prompt == "":
            return web.json_response({"error": BAD_PROMPT}, status=400)
        if prompt == "several":  # Triton's answer to /generate of a model that responds more than once
            return web.json_response({"error": SEVERAL_RESPONSES})
        if prompt == "overload as 500":
            return web.json_response({"error": OVERLOADED}, status=500)
        if prompt == "fault":
            return web.json_response({"error": SERVER_FAULT}, status=500)
        return web.json_response({"text_output": prompt.upper()}, headers={"X-Upstream": "yes"})

    async def generate_stream(request: web.Request) -> web.StreamResponse:
        prompt = json.loads(await request.read())["text_input"][0]
        if prompt == "overload":
            body = f"data: {json.dumps({'error': OVERLOADED})}\n\n"
            return web.Response(status=400, text=body, content_type="text/event-stream")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for word in prompt.split():
            await response.write(f"data: {json.dumps({'text_output': word})}\n\n".encode())
        if prompt.endswith("held"):
            await asyncio.Event().wait()
        await response.write_eof()
        return response

    async def ready(request: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application(client_max_size=2**30)
    app.router.add_post("/v2/models/specbatch/generate", generate)
    app.router.add_post("/v2/models/specbatch/generate_stream", generate_stream)
    app.router.add_get("/v2/health/ready", ready)
    return app


def run(scenario, max_body: int = 1000, upstream_up: bool = True) -> list[int]:
    """``await scenario(client, gateway)`` against a gateway in front of the fake upstream."""
    seen: list[int] = []

    async def main() -> None:
        upstream = TestServer(upstream_app(seen))
        await upstream.start_server()
        url = str(upstream.make_url(""))
        if not upstream_up:
            await upstream.close()
        gateway = build_app(url, max_body)
        async with TestClient(TestServer(gateway)) as client:
            await scenario(client, gateway)
        if upstream_up:
            await upstream.close()

    asyncio.run(main())
    return seen


def test_a_body_past_the_limit_gets_413_and_never_reaches_the_upstream():
    async def scenario(client, gateway):
        for body in (b"x" * 1001, b"x" * 8_000_000):
            reply = await client.post("/v2/models/specbatch/generate", data=body)
            assert reply.status == 413
            assert "at most 1000 bytes" in (await reply.json())["error"]

        async def chunked():
            for _ in range(20):
                yield b"x" * 100

        reply = await client.post("/v2/models/specbatch/generate", data=chunked())
        assert reply.status == 413, "a chunked body is counted as it arrives"
        reply = await client.post("/v2/models/specbatch/generate", json={"text_input": ["fits"]})
        assert reply.status == 200 and (await reply.json()) == {"text_output": "FITS"}
        assert reply.headers["X-Upstream"] == "yes"

    assert run(scenario) == [len(json.dumps({"text_input": ["fits"]}))]


def test_an_overload_refusal_is_a_503_with_retry_after_and_a_bad_prompt_stays_a_400():
    async def scenario(client, gateway):
        for path in ("generate", "generate_stream"):
            reply = await client.post(f"/v2/models/specbatch/{path}", json={"text_input": ["overload"]})
            assert reply.status == 503, path
            assert reply.headers["Retry-After"] == "1"
            assert (await reply.json()) == {"error": OVERLOADED}
        reply = await client.post("/v2/models/specbatch/generate", json={"text_input": [""]})
        assert reply.status == 400 and (await reply.json()) == {"error": BAD_PROMPT}
        reply = await client.post("/v2/models/specbatch/generate", json={"text_input": ["overload as 500"]})
        assert reply.status == 503 and (await reply.json()) == {"error": OVERLOADED}

    run(scenario)


def test_a_body_triton_cannot_parse_is_the_clients_400_and_a_server_fault_stays_a_500():
    async def scenario(client, gateway):
        mistyped = {"text_input": ["hi"], "max_tokens": "8"}
        reply = await client.post("/v2/models/specbatch/generate", json=mistyped)
        assert reply.status == 400 and (await reply.json()) == {"error": UNPARSEABLE}
        reply = await client.post("/v2/models/specbatch/generate", data=b"hello")
        assert reply.status == 400 and (await reply.json()) == {"error": NOT_JSON}
        reply = await client.post("/v2/models/specbatch/generate", json={"text_input": ["fault"]})
        assert reply.status == 500 and (await reply.json()) == {"error": SERVER_FAULT}

    run(scenario)


def test_a_stream_passes_through_event_by_event():
    async def scenario(client, gateway):
        reply = await client.post("/v2/models/specbatch/generate_stream", json={"text_input": ["a b c"]})
        assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in (await reply.text()).splitlines() if line]
        assert events == [{"text_output": "a"}, {"text_output": "b"}, {"text_output": "c"}]

    run(scenario)


def test_an_upstream_that_does_not_answer_is_a_503():
    async def scenario(client, gateway):
        reply = await client.get("/v2/health/ready")
        assert reply.status == 503 and "restarting or unreachable" in (await reply.json())["error"]

    run(scenario, upstream_up=False)


def test_the_limit_cannot_exceed_what_triton_survives():
    with pytest.raises(ValueError, match=r"Triton 2\.51 dies"):
        build_app("http://127.0.0.1:1", MAX_BODY_CEILING + 1)


def test_requests_waiting_on_a_dead_scheduler_are_answered_503_and_others_go_on():
    async def scenario(client, gateway):
        held = gateway[HELD]
        waiting = asyncio.ensure_future(
            client.post("/v2/models/specbatch/generate", json={"text_input": ["held"]})
        )
        streaming = asyncio.ensure_future(
            client.post("/v2/models/specbatch/generate_stream", json={"text_input": ["a held"]})
        )

        async def both_waiting() -> None:
            while len(held) < 2:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(both_waiting(), 30)
        stream_reply = await streaming  # its status went out with the first event
        assert stream_reply.status == 200
        assert held.fail_all() == 2
        reply = await waiting
        assert reply.status == 503 and reply.headers["Retry-After"] == "1"
        assert "scheduler failed" in (await reply.json())["error"]
        events = [json.loads(line[6:]) for line in (await stream_reply.text()).splitlines() if line]
        assert events[0] == {"text_output": "a"} and "scheduler failed" in events[-1]["error"]
        assert len(held) == 0
        reply = await client.post("/v2/models/specbatch/generate", json={"text_input": ["next"]})
        assert reply.status == 200 and (await reply.json()) == {"text_output": "NEXT"}

    run(scenario)


def test_a_generate_answer_carrying_only_an_error_is_a_400_and_served_answers_pass():
    async def scenario(client, gateway):
        reply = await client.post("/v2/models/specbatch/generate", json={"text_input": ["several"]})
        assert reply.status == 400 and (await reply.json()) == {"error": SEVERAL_RESPONSES}
        reply = await client.post("/v2/models/specbatch/generate", json={"text_input": ["fine"]})
        assert reply.status == 200 and (await reply.json()) == {"text_output": "FINE"}

    run(scenario)
