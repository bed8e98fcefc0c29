"""The gRPC relay: calls pass through unchanged; what a dead scheduler held gets one final
error response on its stream; a "retry" refusal is UNAVAILABLE. The upstream here is a
small gRPC server answering as Triton 2.51 does (a held request is never answered);
tests/integration/ run the relay in front of the real server."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from tritonclient.grpc import service_pb2

from specbatch.gateway.grpc_relay import STREAM_INFER, start_grpc_relay
from specbatch.server.ports import free_port
from specbatch.serving.held import SCHEDULER_LOST, HeldRequests

READY = "/inference.GRPCInferenceService/ServerReady"
INFER = "/inference.GRPCInferenceService/ModelInfer"
BROKEN = "the stream broke"
OVERLOADED = "in ensemble 'specbatch', the server is overloaded: 9 prompts are queued (limit 8); retry later"


def response(request: service_pb2.ModelInferRequest, text: str, final: bool) -> bytes:
    inner = service_pb2.ModelInferResponse(id=request.id, model_name=request.model_name)
    inner.parameters["triton_final_response"].bool_param = final
    inner.parameters["text"].string_param = text
    return service_pb2.ModelStreamInferResponse(infer_response=inner).SerializeToString()


class FakeTriton(grpc.GenericRpcHandler):
    """Echoes a request's id as two responses (the second final); model "specbatch" with
    id "held" is never answered, like a request a dead scheduler held; id "break" ends
    the stream with an error, as a Triton that fails does."""

    def __init__(self) -> None:
        self.metadata: list[tuple] = []

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if details.method == STREAM_INFER:
            return grpc.stream_stream_rpc_method_handler(self.stream)
        if details.method == READY:
            return grpc.unary_unary_rpc_method_handler(self.ready)
        if details.method == INFER:
            return grpc.unary_unary_rpc_method_handler(self.overloaded)
        return None

    async def ready(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.metadata.append(tuple(context.invocation_metadata()))
        return service_pb2.ServerReadyResponse(ready=True).SerializeToString()

    async def overloaded(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, OVERLOADED)

    async def stream(self, requests, context: grpc.aio.ServicerContext):
        held = asyncio.Event()
        async for raw in requests:
            request = service_pb2.ModelInferRequest.FromString(raw)
            if request.id == "held":
                continue
            if request.id == "break":
                await context.abort(grpc.StatusCode.INTERNAL, BROKEN)
            yield response(request, f"{request.id}-1", final=False)
            yield response(request, f"{request.id}-2", final=True)
        await held.wait()  # Triton keeps a stream open while a request on it is unanswered


def infer(request_id: str, model: str = "specbatch") -> bytes:
    return service_pb2.ModelInferRequest(id=request_id, model_name=model).SerializeToString()


def decoded(raw: bytes) -> tuple[str, str, str, bool]:
    """(id, text, error, final) of one stream response."""
    message = service_pb2.ModelStreamInferResponse.FromString(raw)
    inner = message.infer_response
    return inner.id, inner.parameters["text"].string_param, message.error_message, inner.parameters[
        "triton_final_response"
    ].bool_param


async def with_relay(scenario):
    upstream = grpc.aio.server()
    fake = FakeTriton()
    upstream.add_generic_rpc_handlers((fake,))
    upstream_port = upstream.add_insecure_port("127.0.0.1:0")
    await upstream.start()
    held = HeldRequests()
    port = free_port()
    relay = await start_grpc_relay("127.0.0.1", port, f"127.0.0.1:{upstream_port}", held)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        return await asyncio.wait_for(scenario(channel, held, fake), 30)
    finally:
        await channel.close()
        await relay.stop(0)
        await upstream.stop(0)


def run(scenario):
    return asyncio.run(with_relay(scenario))


def test_stream_responses_pass_through_unchanged_and_the_stream_ends_with_triton_s():
    async def scenario(channel, held, fake):
        call = channel.stream_stream(STREAM_INFER)()
        await call.write(infer("a"))
        await call.write(infer("b", model="router"))
        await call.done_writing()
        return [decoded(raw) async for raw in _until(call, 4)]

    assert run(scenario) == [
        ("a", "a-1", "", False),
        ("a", "a-2", "", True),
        ("b", "b-1", "", False),
        ("b", "b-2", "", True),
    ]


def test_a_request_the_dead_scheduler_held_gets_one_final_error_and_the_stream_ends():
    async def scenario(channel, held, fake):
        call = channel.stream_stream(STREAM_INFER)()
        for request_id in ("a", "held", "b"):
            await call.write(infer(request_id))
        await call.done_writing()
        answers = [decoded(raw) async for raw in _until(call, 4)]  # "b" answered: "held" was relayed
        assert held.fail_all() == 1  # the one stream
        while (raw := await call.read()) is not grpc.aio.EOF:  # ends: nothing else is owed
            answers.append(decoded(raw))
        return answers, await call.code()

    answers, code = run(scenario)
    assert answers == [
        ("a", "a-1", "", False),
        ("a", "a-2", "", True),
        ("b", "b-1", "", False),
        ("b", "b-2", "", True),
        ("held", "", SCHEDULER_LOST, True),
    ]
    assert code == grpc.StatusCode.OK


def test_when_triton_s_stream_breaks_every_request_it_owed_gets_its_own_final_error_first():
    async def scenario(channel, held, fake):
        call = channel.stream_stream(STREAM_INFER)()
        await call.write(infer("a"))
        answers = [decoded(raw) async for raw in _until(call, 2)]
        for request_id in ("held", "break"):
            await call.write(infer(request_id, model="qwen3_specdec"))
        with pytest.raises(grpc.aio.AioRpcError):  # the stream's own end, after the answers
            while True:
                answers.append(decoded(await call.read()))
        return answers, await call.code(), await call.details()

    answers, code, details = run(scenario)
    assert answers == [
        ("a", "a-1", "", False),
        ("a", "a-2", "", True),
        ("held", "", BROKEN, True),
        ("break", "", BROKEN, True),
    ]
    assert (code, details) == (grpc.StatusCode.INTERNAL, BROKEN)


def test_a_request_to_a_model_off_the_scheduler_path_is_not_failed():
    async def scenario(channel, held, fake):
        call = channel.stream_stream(STREAM_INFER)()
        await call.write(infer("held", model="qwen3_specdec"))
        await call.write(infer("sync", model="router"))
        answers = [decoded(raw) async for raw in _until(call, 2)]
        assert held.fail_all() == 1
        await call.write(infer("after"))
        return answers + [decoded(raw) async for raw in _until(call, 2)]

    assert run(scenario) == [
        ("sync", "sync-1", "", False),
        ("sync", "sync-2", "", True),
        ("after", "after-1", "", False),
        ("after", "after-2", "", True),
    ]


def test_a_retry_refusal_is_unavailable_and_metadata_reaches_triton():
    async def scenario(channel, held, fake):
        ready = service_pb2.ServerReadyResponse.FromString(
            await channel.unary_unary(READY)(b"", metadata=(("triton-grpc-protocol-key", "k"),))
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await channel.unary_unary(INFER)(infer("x"))
        return ready.ready, refused.value, fake.metadata

    ready, refused, metadata = run(scenario)
    assert ready
    assert (refused.code(), refused.details()) == (grpc.StatusCode.UNAVAILABLE, OVERLOADED)
    assert ("triton-grpc-protocol-key", "k") in metadata[0]


def test_an_unreachable_triton_is_unavailable():
    async def scenario():
        port = free_port()
        relay = await start_grpc_relay("127.0.0.1", port, f"127.0.0.1:{free_port()}", HeldRequests())
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await channel.unary_unary(READY)(b"", timeout=10)
            return refused.value
        finally:
            await relay.stop(0)

    refused = asyncio.run(scenario())
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    assert "retry" in refused.details()


async def _until(call, count: int):
    """The next ``count`` responses of a stream."""
    for _ in range(count):
        yield await call.read()

