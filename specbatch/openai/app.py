"""The aiohttp application: OpenAI routes, server-sent events, errors, disconnects, a bound.

Every request holds one slot of `max_pending` for its lifetime; past that the front
answers 503 at once rather than queueing without limit (the scheduler behind it has
its own admission). A client that disconnects cancels its handler (aiohttp's
`handler_cancellation`), which closes the upstream stream and frees the rows. SIGUSR1
says the scheduler died: every request waiting on it is answered 503 (see
specbatch.serving.held).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import AsyncIterator, Callable, Sequence

from aiohttp import web

from specbatch.openai.errors import OpenAIError, bad_request
from specbatch.openai.requests import Call, parse_chat, parse_completion
from specbatch.openai.responses import Reply
from specbatch.openai.upstream import Delta, Outcome, TritonUpstream
from specbatch.serving.held import HeldRequests

logger = logging.getLogger(__name__)

UPSTREAM = web.AppKey("upstream", TritonUpstream)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Connection": "keep-alive"}


class Front:
    """Request handlers over one upstream; `served` are the model names clients may ask for."""

    def __init__(self, served: Sequence[str], max_pending: int) -> None:
        if not served or max_pending < 1:
            raise ValueError("the front needs at least one model name and max_pending >= 1")
        self.served = tuple(served)
        self.max_pending = max_pending
        self.pending = 0
        self.held = HeldRequests()

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [_model_card(name) for name in self.served]})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name not in self.served:
            return _error(_unknown_model(name, self.served))
        return web.json_response(_model_card(name))

    async def health(self, request: web.Request) -> web.Response:
        ready = await request.app[UPSTREAM].ready()
        return web.json_response({"ready": ready}, status=200 if ready else 503)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, parse_completion)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, parse_chat)

    async def _serve(self, request: web.Request, parse: Callable[[object], Call]) -> web.StreamResponse:
        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise bad_request("the request body is not valid JSON") from None
            call = parse(body)
            if call.model not in self.served:
                raise _unknown_model(call.model, self.served)
            if self.pending >= self.max_pending:
                raise OpenAIError(503, "the server is overloaded; retry later", code="overloaded")
            self.pending += 1
            try:
                with self.held.waiting() as failed:
                    events = _unless_failed(request.app[UPSTREAM].run(call), failed)
                    if call.stream:
                        return await _stream(request, events, call)
                    return await _complete(events, call)
            finally:
                self.pending -= 1
        except OpenAIError as exc:
            if exc.status >= 500:
                logger.warning("answered %d: %s", exc.status, exc.message)
            return _error(exc)


async def _unless_failed(
    events: AsyncIterator[Delta | list[Outcome]], failed: asyncio.Future[str]
) -> AsyncIterator[Delta | list[Outcome]]:
    """The pipeline's events until ``failed`` is set (the scheduler died): then a 503.

    However it ends (a 503, the client gone and the handler cancelled), the pending read
    is cancelled first, which ends the upstream call (and frees its rows), and only then
    is the upstream iterator closed (an iterator being read cannot be closed)."""
    step: asyncio.Future | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(events))
            await asyncio.wait({step, failed}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                raise OpenAIError(503, failed.result(), code="overloaded")
            try:
                event = step.result()
            except StopAsyncIteration:
                return
            yield event
    finally:
        if step is not None and not step.done():
            step.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await step
        await events.aclose()


async def _complete(events: AsyncIterator[Delta | list[Outcome]], call: Call) -> web.Response:
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, list):
                _raise_prompt_errors(event, call.copies)
                return web.json_response(Reply(call).complete(event))
    raise OpenAIError(502, "the pipeline sent no answer")


async def _stream(
    request: web.Request, events: AsyncIterator[Delta | list[Outcome]], call: Call
) -> web.StreamResponse:
    """Server-sent events: chunks as text is accepted, each choice's end, usage, `[DONE]`.

    The first event is awaited before the response starts, so a request the pipeline
    refuses outright still gets an HTTP error status rather than a stream.
    """
    reply = Reply(call)
    async with contextlib.aclosing(events):
        event = await anext(events)
        if isinstance(event, list):
            _raise_prompt_errors(event, call.copies)
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        try:
            if call.kind == "chat":  # every choice's role first, as OpenAI and vLLM send it
                for index in range(len(call.prompts)):
                    await _send(response, reply.chunk(index, "", role=True))
            elif call.echo:  # every choice's prompt first, as vLLM sends it
                for index in range(len(call.prompts)):
                    await _send(response, reply.chunk(index, call.prompt_of_choice(index)))
            while isinstance(event, Delta):
                logprobs = reply.chunk_logprobs(event.logprobs, event.index)
                await _send(response, reply.chunk(event.index, event.text, logprobs=logprobs))
                event = await anext(events)
            _raise_prompt_errors(event, call.copies)
            for index, outcome in enumerate(event):
                logprobs = reply.chunk_logprobs(outcome.logprobs, index)
                end = reply.chunk(index, None, outcome.finish_reason, logprobs=logprobs)
                await _send(response, end)
            if call.include_usage:
                await _send(response, reply.usage_chunk(event))
        except OpenAIError as exc:
            await _send(response, exc.body())
        except ConnectionResetError:
            return response
        await response.write(b"data: [DONE]\n\n")
    return response


async def _send(response: web.StreamResponse, payload: dict) -> None:
    await response.write(f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode())


def _raise_prompt_errors(outcomes: list[Outcome], n: int) -> None:
    """OpenAI has no per-choice error: a prompt that failed fails the request, naming it
    once however many of its ``n`` copies failed."""
    failed = {i // n: o.error for i, o in reversed(list(enumerate(outcomes))) if o.error}
    if failed:
        message = "; ".join(f"prompt {i}: {error}" for i, error in sorted(failed.items()))
        raise OpenAIError(400, message if len(outcomes) > n else failed[0], param="prompt")


def _model_card(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "specbatch"}


def _unknown_model(name: str, served: Sequence[str]) -> OpenAIError:
    return OpenAIError(
        404,
        f"the model {name!r} does not exist; this server serves {', '.join(served)}",
        param="model",
        code="model_not_found",
    )


def _error(exc: OpenAIError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)


@web.middleware
async def openai_errors(request: web.Request, handler: Callable) -> web.StreamResponse:
    """aiohttp's own refusals (no such route, a method the route lacks, a body over the
    size limit) in OpenAI's error format, as every other error: clients parse the body
    of any 4xx as ``{"error": {...}}`` and report its message, and aiohttp's bodies are
    plain text."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 404:
            served = sorted({resource.canonical for resource in request.app.router.resources()})
            message = f"no route {request.method} {request.path}; this server serves {', '.join(served)}"
        elif exc.status == 405:
            message = f"{request.method} is not allowed on {request.path}"
        else:
            message = exc.text or exc.reason
        return _error(OpenAIError(exc.status, message))


def build_app(grpc_url: str, served: Sequence[str], max_pending: int) -> web.Application:
    """The front's application; its gRPC channel opens and closes with the app's event loop."""
    front = Front(served, max_pending)
    app = web.Application(middlewares=[openai_errors])
    app.router.add_get("/v1/models", front.models)
    app.router.add_get("/v1/models/{model}", front.model)
    app.router.add_post("/v1/completions", front.completions)
    app.router.add_post("/v1/chat/completions", front.chat_completions)
    app.router.add_get("/health", front.health)

    async def channel(app: web.Application):
        app[UPSTREAM] = TritonUpstream(grpc_url)
        yield
        await app[UPSTREAM].close()

    async def scheduler_lost_signal(app: web.Application) -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, front.held.fail_all)

    app.cleanup_ctx.append(channel)
    app.on_startup.append(scheduler_lost_signal)
    return app
