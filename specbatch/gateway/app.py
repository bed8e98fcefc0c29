"""The HTTP front users reach: Triton's HTTP and metrics endpoints behind a body limit
and status codes clients can act on.

Why it exists. Triton 2.51's HTTP server dies (SIGSEGV) on any request body over about
4 MiB, on every path, `/v2/health/ready` and `/metrics` included (measured: 4.0 MB is
answered, 4.2 MB kills the process and every request in flight), and it has no option
to cap the body size. So Triton's HTTP and metrics listeners stay on loopback, and this
front, on the ports users reach, answers a larger body with 413 before it reaches them.

It also gives an overload the status clients retry on. Triton's ensemble hands the
scheduler's UNAVAILABLE to an HTTP client as 400 ("in ensemble 'specbatch', the server
is overloaded ..."), and a step whose process died as 400 too ("Stub process ... is not
healthy"); gateways and retrying clients treat a 400 as the client's fault and never
retry. A 400 or 500 (or the 404 of a model being brought back) whose message says so
becomes 503 with Retry-After (see specbatch.serving.availability), and a Triton
that does not answer at all (restarting) is a 503 as well; so is a health check that
says "not ready" (Triton says 400). A body Triton cannot parse (not JSON, or a
parameter of the wrong JSON type), which it answers 500, becomes the 400 it is, and
so does the 200 carrying only an error with which it answers `/generate` for a request
the model answers more than once (`"stream": true`). Everything else passes through
unchanged, streamed (`/generate_stream`'s events go out as they come). Requests
waiting on a scheduler that died are answered here (see specbatch.serving.held).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from specbatch.serving.availability import is_unavailable
from specbatch.serving.held import SCHEDULER_MODELS, HeldRequests

logger = logging.getLogger(__name__)

# Triton 2.51 serves a 4.0 MB body and dies on 4.2 MB: the limit may not go past this.
MAX_BODY_CEILING = 4_000_000
# Room for a 1 MiB prompt (the scheduler's per-prompt limit) and a little more.
DEFAULT_MAX_BODY = 3 * 1024 * 1024
RETRY_AFTER_S = "1"
# How Triton's HTTP server begins the message of a request body it cannot parse: not
# JSON at all, or a parameter of the wrong JSON type.
UNPARSEABLE = ("failed to parse the request JSON buffer", "Unable to parse")

# Headers that describe one hop's connection, not the message (RFC 9110 §7.6.1).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
        "host",
        "content-length",
    }
)
TRITON_URL = web.AppKey("upstream", str)
MAX_BODY = web.AppKey("max_body", int)
SESSION = web.AppKey("session", aiohttp.ClientSession)
HELD = web.AppKey("held", HeldRequests)
# Requests that pass through the scheduler: the ensemble and the scheduler model itself.
THROUGH_SCHEDULER = tuple(f"/v2/models/{model}/" for model in SCHEDULER_MODELS)


def build_app(upstream: str, max_body: int = DEFAULT_MAX_BODY) -> web.Application:
    """An application that forwards every request to ``upstream`` (``http://host:port``)."""
    if not 0 < max_body <= MAX_BODY_CEILING:
        raise ValueError(
            f"max_body must be between 1 and {MAX_BODY_CEILING} bytes: Triton 2.51 dies on larger bodies"
        )
    app = web.Application(client_max_size=max_body, middlewares=[_limit_body])
    app[TRITON_URL] = upstream.rstrip("/")
    app[MAX_BODY] = max_body
    app[HELD] = HeldRequests()
    app.on_startup.append(_open_session)
    app.on_cleanup.append(_close_session)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


@web.middleware
async def _limit_body(request: web.Request, handler) -> web.StreamResponse:
    """A declared length past the limit is refused before a byte of the body is read."""
    limit = request.app[MAX_BODY]
    if request.content_length is not None and request.content_length > limit:
        return _too_large(limit)
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:  # a chunked body that grew past the limit
        return _too_large(limit)


@dataclass
class _ResponseSlot:
    """The response once its status has gone out (a stream), else None."""

    response: web.StreamResponse | None = None


async def forward(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    if not request.path.startswith(THROUGH_SCHEDULER):
        return await _forward(request, body, _ResponseSlot())
    with request.app[HELD].waiting() as failed:
        return await _forward_unless_failed(request, body, failed)


async def _forward_unless_failed(
    request: web.Request, body: bytes, failed: asyncio.Future[str]
) -> web.StreamResponse:
    """Forward, but answer with ``failed``'s message if it is set first (the scheduler died)."""
    sink = _ResponseSlot()
    relay = asyncio.ensure_future(_forward(request, body, sink))
    try:
        await asyncio.wait({relay, failed}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not relay.done():
            relay.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await relay
    if not relay.cancelled():
        return relay.result()
    message = failed.result()
    if sink.response is None:
        return _unavailable(message)
    await sink.response.write(f"data: {json.dumps({'error': message})}\n\n".encode())
    await sink.response.write_eof()
    return sink.response


async def _forward(request: web.Request, body: bytes, sink: _ResponseSlot) -> web.StreamResponse:
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
    url = request.app[TRITON_URL] + request.rel_url.path_qs
    try:
        async with request.app[SESSION].request(
            request.method, url, headers=headers, data=body, allow_redirects=False
        ) as upstream:
            return await _relay(request, upstream, sink)
    except aiohttp.ClientConnectionError as exc:
        if request.transport is None or request.transport.is_closing():
            raise  # the client left; nobody to answer
        logger.warning("tritonserver did not answer %s %s: %s", request.method, request.path, exc)
        return _unavailable("the server is restarting or unreachable; retry later")


async def _relay(
    request: web.Request, upstream: aiohttp.ClientResponse, sink: _ResponseSlot
) -> web.StreamResponse:
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
    if request.path.startswith("/v2/health/") and upstream.status == 400:
        return web.Response(status=503, body=await upstream.read(), headers=headers)
    plain = "Content-Encoding" not in upstream.headers
    events = "text/event-stream" in upstream.headers.get("Content-Type", "")
    if upstream.status in (400, 404, 500) and plain:
        body = await upstream.read()
        message = _event_error(body) if events else _error_message(body)
        if message is not None and is_unavailable(message):
            return _unavailable(message)
        status = 400 if upstream.status == 500 and _unparseable(message) else upstream.status
        return web.Response(status=status, body=body, headers=headers)
    if upstream.status == 200 and plain and not events and request.path.endswith("/generate"):
        body = await upstream.read()
        return web.Response(status=400 if _only_an_error(body) else 200, body=body, headers=headers)
    first = b""
    if upstream.status == 200 and plain and events:
        # A stream whose first response is an error may also come as 200 with an error
        # event: looked at before the status goes out.
        first = await upstream.content.readany()
        message = _event_error(first)
        if message is not None and is_unavailable(message):
            return _unavailable(message)
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
    await response.prepare(request)
    sink.response = response
    if first:
        await response.write(first)
    async for chunk in upstream.content.iter_any():
        await response.write(chunk)
    await response.write_eof()
    return response


def _unparseable(message: str | None) -> bool:
    """Whether Triton's 500 is its JSON parser refusing the request. A body that is not
    JSON ("failed to parse the request JSON buffer: Invalid value. at 0") and a parameter
    of the wrong JSON type (``"max_tokens": "8"``: "Unable to parse 'data': attempt to
    access JSON non-signed-integer as signed-integer") are answered 500 by Triton 2.51,
    which retrying clients and gateways take for a server fault and send again; they are
    the client's to fix."""
    return message is not None and message.startswith(UNPARSEABLE)


def _only_an_error(body: bytes) -> bool:
    """Whether a 200 from ``/generate`` carries nothing but an error. Triton 2.51 answers
    a request whose model sends several responses (``"stream": true``) with 200 and
    {"error": "generate expects model to produce exactly 1 response, ..."}; an answer the
    pipeline served always carries its outputs beside its (possibly empty) errors."""
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    return isinstance(answer, dict) and set(answer) == {"error"} and bool(answer["error"])


def _error_message(body: bytes) -> str | None:
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    return error if isinstance(error, str) else None


def _event_error(event: bytes) -> str | None:
    data = b"".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
    return _error_message(data) if data else None


def _unavailable(message: str) -> web.Response:
    return web.json_response({"error": message}, status=503, headers={"Retry-After": RETRY_AFTER_S})


def _too_large(limit: int) -> web.Response:
    return web.json_response(
        {"error": f"request body too large: at most {limit} bytes are accepted"}, status=413
    )


async def _open_session(app: web.Application) -> None:
    # Triton and the scheduler bound the load, not the gateway; no idle connections are kept,
    # since Triton waits out its exit timeout for every open one when it stops.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
    app[SESSION] = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)


async def _close_session(app: web.Application) -> None:
    await app[SESSION].close()
