"""The gRPC front users reach: Triton's gRPC endpoint relayed call by call, so that a
request a dead scheduler held is still answered.

Why it exists. Triton 2.51 never answers a request that a decoupled model's stub
process held when it died (see specbatch.serving.held): a client of Triton's own gRPC
port waited for its own deadline although the scheduler was back within seconds. So
Triton's gRPC listener stays on loopback, like its HTTP one, and this relay serves the
public gRPC port. Every call passes through unchanged, as bytes: the unary calls, and
the `ModelStreamInfer` stream message by message in both directions. On a stream it
keeps the requests sent to the ensemble or the scheduler that have no final response
yet; when the scheduler dies (SIGUSR1, as for the HTTP gateway) each of them gets a
final error response on its stream ("... has been restarted; retry"), and a late
response to one of them is dropped, so every request still gets exactly one final
response.

It also gives errors the status clients retry on: a unary call refused with a message
that means "retry" (overload, a step being brought back) goes out as UNAVAILABLE, and
so does a Triton that does not answer (restarting); a stream whose upstream breaks ends
with UNAVAILABLE, after a final error response for each request on it still unanswered.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from collections.abc import AsyncIterator, Container

import grpc
from tritonclient.grpc import service_pb2

from specbatch.serving.availability import is_unavailable
from specbatch.serving.held import SCHEDULER_MODELS, HeldRequests
from specbatch.triton.stream_flags import is_final_response

logger = logging.getLogger(__name__)

STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
# What Triton itself takes over gRPC without harm (measured: 64 MB); the scheduler refuses
# a prompt over its own limit with a clear error, so the relay must let such a body reach it.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)
UNREACHABLE = "the server is restarting or unreachable; retry later"
_UPSTREAM_ENDED = object()  # the upstream stream ended
_CLIENT_DONE = object()  # the client has sent its last request


def _forwarded(context: grpc.aio.ServicerContext) -> tuple[tuple[str, str | bytes], ...]:
    """The caller's metadata that belongs to the call (the admin key, a request id), not to the hop."""
    return tuple(
        (key, value)
        for key, value in context.invocation_metadata() or ()
        if not key.startswith((":", "grpc-")) and key not in ("user-agent", "content-type", "te")
    )


class _Unanswered:
    """The requests on one stream that have no final response yet, by (request id, model).

    Ids are often empty: then only the count tells requests apart, which is all a failure
    needs, since each gets one error response carrying its id and model.
    """

    def __init__(self) -> None:
        self._pending: Counter[tuple[str, str]] = Counter()
        self._answered_here: Counter[str] = Counter()  # ids the relay failed; Triton never will

    def sent(self, request: service_pb2.ModelInferRequest) -> None:
        self._pending[(request.id, request.model_name)] += 1

    def received(self, response: service_pb2.ModelStreamInferResponse) -> bool:
        """Whether to pass ``response`` on: not when the relay already answered its request."""
        inner = response.infer_response
        final = bool(response.error_message) or is_final_response(inner)
        if self._answered_here[inner.id] > 0:
            if final:
                self._answered_here[inner.id] -= 1
            return False
        key = (inner.id, inner.model_name)
        if final and self._pending[key] > 0:
            self._pending[key] -= 1
        return True

    def fail(self, message: str, models: Container[str] | None = None) -> list[bytes]:
        """One final error response for every unanswered request (to one of ``models``;
        None: to any model)."""
        failures = []
        owed = [key for key, count in self._pending.items() if count]
        for key in [key for key in owed if models is None or key[1] in models]:
            request_id, model = key
            count = self._pending.pop(key)
            failures += [_error_response(request_id, model, message)] * count
            self._answered_here[request_id] += count
        return failures

    def only_failed_left(self) -> bool:
        """Nothing is owed but what the relay answered itself: Triton will not end the stream."""
        return not +self._pending and bool(+self._answered_here)


def _error_response(request_id: str, model: str, message: str) -> bytes:
    response = service_pb2.ModelStreamInferResponse(
        error_message=message,
        infer_response=service_pb2.ModelInferResponse(id=request_id, model_name=model),
    )
    response.infer_response.parameters["triton_final_response"].bool_param = True
    return response.SerializeToString()


class GrpcRelay(grpc.GenericRpcHandler):
    """Every method of Triton's GRPCInferenceService, forwarded as bytes to ``upstream``."""

    def __init__(self, upstream: str, held: HeldRequests) -> None:
        self._upstream = upstream
        self._held = held
        self._channel: grpc.aio.Channel | None = None
        self._server: grpc.aio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        """Open the upstream channel and serve ``host``:``port`` (on the running loop)."""
        self._channel = grpc.aio.insecure_channel(self._upstream, options=CHANNEL_OPTIONS)
        self._server = grpc.aio.server(options=CHANNEL_OPTIONS)
        self._server.add_generic_rpc_handlers((self,))
        if self._server.add_insecure_port(f"{host}:{port}") == 0:
            raise OSError(f"the gRPC port {port} on {host} cannot be bound")
        await self._server.start()

    async def stop(self, grace_s: float) -> None:
        """Let calls in flight finish for ``grace_s``, then close the upstream channel."""
        if self._server is not None:
            await self._server.stop(grace_s)
        if self._channel is not None:
            await self._channel.close()

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        if method == STREAM_INFER:
            return grpc.stream_stream_rpc_method_handler(self._stream)
        return grpc.unary_unary_rpc_method_handler(functools.partial(self._unary, method))

    async def _unary(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        call = self._channel.unary_unary(method)
        try:
            return await call(request, metadata=_forwarded(context), timeout=context.time_remaining())
        except grpc.aio.AioRpcError as error:
            code, details = _client_status(error)
            await context.abort(code, details)

    async def _stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        call = self._channel.stream_stream(STREAM_INFER)(
            metadata=_forwarded(context), timeout=context.time_remaining()
        )
        unanswered = _Unanswered()
        outgoing: asyncio.Queue[object] = asyncio.Queue()
        tasks = [
            asyncio.ensure_future(_relay_requests(requests, call, unanswered, outgoing)),
            asyncio.ensure_future(_relay_responses(call, outgoing)),
            asyncio.ensure_future(self._fail_on_scheduler_loss(unanswered, outgoing)),
        ]
        written = False
        try:
            while (item := await outgoing.get()) is not _UPSTREAM_ENDED:
                if isinstance(item, grpc.aio.AioRpcError):
                    # Triton's stream broke: each request it still owed is answered by its
                    # own id first, so a client that waits per request is not left waiting.
                    code, details = _client_status(item)
                    for failure in unanswered.fail(details):
                        yield failure
                    await context.abort(code, details)
                if item is _CLIENT_DONE:
                    written = True
                elif isinstance(item, list):  # the relay's own final answers
                    for failure in item:
                        yield failure
                elif unanswered.received(service_pb2.ModelStreamInferResponse.FromString(item)):
                    yield item
                if written and unanswered.only_failed_left() and outgoing.empty():
                    # what is left waits on a dead scheduler: Triton never ends this stream.
                    # Not before the queue is drained: the relay's failures, made while this
                    # loop was paused on a response, may be waiting in it.
                    return
        finally:
            for task in tasks:
                task.cancel()
            call.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _fail_on_scheduler_loss(self, unanswered: _Unanswered, outgoing: asyncio.Queue) -> None:
        while True:
            with self._held.waiting() as failed:
                message = await failed
            failures = unanswered.fail(message, SCHEDULER_MODELS)
            if failures:
                logger.warning("the scheduler died: %d request(s) on a gRPC stream answered", len(failures))
                outgoing.put_nowait(failures)


async def _relay_requests(
    requests: AsyncIterator[bytes],
    call: grpc.aio.StreamStreamCall,
    unanswered: _Unanswered,
    outgoing: asyncio.Queue,
) -> None:
    async for raw in requests:
        unanswered.sent(service_pb2.ModelInferRequest.FromString(raw))
        await call.write(raw)
    await call.done_writing()
    outgoing.put_nowait(_CLIENT_DONE)


async def _relay_responses(call: grpc.aio.StreamStreamCall, outgoing: asyncio.Queue) -> None:
    try:
        async for raw in call:
            outgoing.put_nowait(raw)
    except grpc.aio.AioRpcError as error:
        outgoing.put_nowait(error)
        return
    outgoing.put_nowait(_UPSTREAM_ENDED)


def _client_status(error: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str]:
    """The status and message a client of the relay gets for Triton's ``error``."""
    details = error.details() or ""
    if error.code() == grpc.StatusCode.UNAVAILABLE:
        return grpc.StatusCode.UNAVAILABLE, UNREACHABLE if "connect" in details.lower() else details
    if is_unavailable(details):
        return grpc.StatusCode.UNAVAILABLE, details
    return error.code(), details


async def start_grpc_relay(host: str, port: int, upstream: str, held: HeldRequests) -> GrpcRelay:
    """Serve ``host``:``port``, relaying to ``upstream`` (host:port)."""
    relay = GrpcRelay(upstream, held)
    await relay.start(host, port)
    return relay
