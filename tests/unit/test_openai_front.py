"""The OpenAI front without a server: request validation, error mapping, the pipeline's tensors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from specbatch.logprobs import TokenLogprob, to_json
from specbatch.openai.errors import OpenAIError, from_pipeline
from specbatch.openai.requests import copy_seed, parse_chat, parse_completion
from specbatch.openai.responses import Reply
from specbatch.openai.upstream import ROUTER_OUTPUTS, Outcome, scheduler_arrays, triton_datatype

ROOT = Path(__file__).resolve().parents[2]


def test_a_completion_keeps_its_prompts_in_order_with_its_options():
    call = parse_completion(
        {"model": "m", "prompt": ["a", "b"], "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "stop": "\n"}
    )
    assert call.kind == "completion" and call.prompts == ("a", "b")
    assert (call.max_tokens, call.temperature, call.top_p, call.stop) == (5, 0.5, 0.9, ("\n",))
    assert not call.stream and not call.include_usage


def test_a_chat_is_its_last_user_turn_plus_the_earlier_turns():
    call = parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
                },
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Name a colour."},
            ],
            "max_completion_tokens": 7,
            "stream": True,
            "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": True},
        }
    )
    assert call.prompts == ("Name a colour.",) and call.max_tokens == 7
    assert json.loads(call.chat_history) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello."},
    ]
    assert call.enable_thinking and call.stream and call.include_usage


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x"}, "model"),
        ({"model": "m", "prompt": []}, "prompt"),
        ({"model": "m", "prompt": [[1, 2]]}, "prompt"),
        ({"model": "m", "prompt": "x", "n": 0}, "n"),
        ({"model": "m", "prompt": "x", "n": 1.5}, "n"),
        ({"model": "m", "prompt": ["x", "y"], "n": 33}, "n"),
        ({"model": "m", "prompt": ["x"] * 65}, "prompt"),
        ({"model": "m", "prompt": "x", "best_of": 2, "n": 3}, "best_of"),
        ({"model": "m", "prompt": "x", "best_of": 2, "stream": True}, "best_of"),
        ({"model": "m", "prompt": ["x"] * 9, "best_of": 8}, "n"),
        ({"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens"),
        ({"model": "m", "prompt": "x", "top_p": 0}, "top_p"),
        ({"model": "m", "prompt": "x", "temperature": 2.5}, "temperature"),
        ({"model": "m", "prompt": "x", "stop": [1]}, "stop"),
        ({"model": "m", "prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"model": "m", "prompt": "x", "echo": True, "logprobs": 1}, "echo"),
        ({"model": "m", "prompt": "x", "echo": "yes"}, "echo"),
        ({"model": "m", "prompt": "x", "ignore_eos": "true"}, "ignore_eos"),
        ({"model": "m", "prompt": "x", "min_tokens": -1}, "min_tokens"),
        ({"model": "m", "prompt": "x", "min_tokens": 9, "max_tokens": 8}, "min_tokens"),
        ({"model": "m", "prompt": "x", "min_tokens": 2.0}, "min_tokens"),
        ({"model": "m", "prompt": "x", "self_refine": "yes"}, "self_refine"),
        ({"model": "m", "prompt": "x", "frequency_penalty": 2.5}, "frequency_penalty"),
        ({"model": "m", "prompt": "x", "presence_penalty": "1"}, "presence_penalty"),
        ({"model": "m", "prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
        ({"model": "m", "prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
        ({"model": "m", "prompt": "x", "logit_bias": {"the": 1}}, "logit_bias"),
        ({"model": "m", "prompt": "x", "logit_bias": [5, 1]}, "logit_bias"),
        ({"model": "m", "prompt": "x", "response_format": {"type": "json_object"}}, "response_format"),
        ({"model": "m", "prompt": "x", "tool_choice": "required"}, "tool_choice"),
        ({"model": "m", "prompt": "x", "min_p": 1.1}, "min_p"),
        ({"model": "m", "prompt": "x", "guided_choice": ["a", "b"]}, "guided_choice"),
        ({"model": "m", "prompt": "x", "top_k": -2}, "top_k"),
        ({"model": "m", "prompt": "x", "top_k": 2.5}, "top_k"),
        ({"model": "m", "prompt": "x", "seed": 1.5}, "seed"),
        ({"model": "m", "prompt": "x", "seed": True}, "seed"),
        ({"model": "m", "prompt": "x", "seed": 1 << 64}, "seed"),
        ({"model": "m", "prompt": "x", "stop_token_ids": 5}, "stop_token_ids"),
        ({"model": "m", "prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids"),
        ({"model": "m", "prompt": "x", "stop_token_ids": list(range(17))}, "stop_token_ids"),
        ({"model": "m", "prompt": "x", "logprobs": 21}, "logprobs"),
        ({"model": "m", "prompt": "x", "logprobs": -1}, "logprobs"),
        ({"model": "m", "prompt": "x", "logprobs": True}, "logprobs"),
        ({"model": "m", "prompt": "x", "top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_bad_completions_name_the_parameter(body, param):
    with pytest.raises(OpenAIError) as caught:
        parse_completion(body)
    assert caught.value.status == 400 and caught.value.body()["error"]["param"] == param


def test_clients_defaults_for_what_the_pipeline_lacks_are_accepted_and_top_k_is_kept():
    defaults = {
        "frequency_penalty": 0,
        "presence_penalty": 0.0,
        "repetition_penalty": 1.0,
        "response_format": {"type": "text"},
        "tool_choice": "none",
        "min_p": 0.0,
        "stop_token_ids": [],
        "logit_bias": {},
    }
    call = parse_chat({"model": "m", "messages": [{"role": "user", "content": "u"}], "top_k": 5, **defaults})
    assert call.top_k == 5 and call.seed is None
    assert parse_completion({"model": "m", "prompt": "x", "top_k": -1}).top_k == 0
    assert parse_completion({"model": "m", "prompt": "x"}).top_k is None


def test_min_tokens_reaches_the_scheduler_only_when_set():
    routed = {
        "routed_task": np.array([[b"infobench"]], dtype=np.object_),
        "route_error": np.array([[b""]], dtype=np.object_),
    }
    call = parse_completion({"model": "m", "prompt": "x", "max_tokens": 64, "min_tokens": 48, "stop": "\n"})
    assert call.min_tokens == 48 and scheduler_arrays(call, routed)["min_tokens"].tolist() == [[48]]
    for body in ({}, {"min_tokens": 0}):
        unset = parse_completion({"model": "m", "prompt": "x", **body})
        assert unset.min_tokens == 0 and "min_tokens" not in scheduler_arrays(unset, routed)


@pytest.mark.parametrize("flag", ["ignore_eos", "include_stop_str_in_output"])
def test_vllms_flags_are_honoured_and_reach_the_scheduler_only_when_true(flag):
    routed = {
        "routed_task": np.array([[b"infobench"]], dtype=np.object_),
        "route_error": np.array([[b""]], dtype=np.object_),
    }
    on = parse_completion({"model": "m", "prompt": "x", "max_tokens": 9, flag: True})
    assert getattr(on, flag) and scheduler_arrays(on, routed)[flag].tolist() == [[True]]
    for body in ({}, {flag: False}, {flag: None}):
        off = parse_completion({"model": "m", "prompt": "x", **body})
        assert not getattr(off, flag) and flag not in scheduler_arrays(off, routed)
    with pytest.raises(OpenAIError) as caught:
        parse_completion({"model": "m", "prompt": "x", flag: "true"})
    assert caught.value.body()["error"]["param"] == flag


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
        [
            {"role": "user", "content": "a"},
            {"role": "system", "content": "b"},
            {"role": "user", "content": "c"},
        ],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        [{"role": "tool", "content": "a"}],
    ],
)
def test_chats_the_pipeline_cannot_serve_are_refused(messages):
    with pytest.raises(OpenAIError) as caught:
        parse_chat({"model": "m", "messages": messages})
    assert caught.value.status == 400


def test_pipeline_errors_map_to_openai_status_codes():
    assert from_pipeline("prompt is empty").status == 400
    assert from_pipeline("scheduler overloaded: queue is full").status == 503
    assert from_pipeline("deadline exceeded while queued").status == 504
    assert from_pipeline("x").body() == {
        "error": {"message": "x", "type": "invalid_request_error", "param": None, "code": None}
    }


def test_usage_adds_every_choice_and_chunks_carry_null_usage_until_the_last():
    call = parse_completion(
        {"model": "m", "prompt": ["a", "b"], "stream": True, "stream_options": {"include_usage": True}}
    )
    outcomes = [Outcome("x", "infobench", "length", "", 3, 4), Outcome("y", "graph", "stop", "", 0, 0)]
    reply = Reply(call)
    assert reply.complete(outcomes)["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
    }
    assert reply.chunk(1, "t")["usage"] is None and reply.chunk(1, "t")["choices"][0]["index"] == 1
    assert reply.usage_chunk(outcomes)["choices"] == []


def test_n_choices_run_each_prompt_n_times_each_copy_on_a_seed_of_its_own():
    routed = {
        "routed_task": np.array([[b"infobench"] * 6], dtype=np.object_),
        "route_error": np.array([[b""] * 6], dtype=np.object_),
    }
    call = parse_completion({"model": "m", "prompt": ["a", "b"], "n": 3, "seed": 7, "temperature": 1.0})
    assert call.prompts == ("a", "a", "a", "b", "b", "b") and call.n == 3
    seeds = scheduler_arrays(call, routed)["random_seed"].tolist()[0]
    assert seeds[0] == seeds[3] == 7, "copy 0 of each prompt samples as n = 1 would"
    assert seeds[1:3] == seeds[4:6] == [copy_seed(7, 1), copy_seed(7, 2)]
    assert len({7, copy_seed(7, 1), copy_seed(7, 2), copy_seed(8, 1)}) == 4
    assert all(0 <= seed < 1 << 64 for seed in seeds)
    unseeded = parse_chat({"model": "m", "messages": [{"role": "user", "content": "u"}], "n": 2})
    assert unseeded.prompts == ("u", "u") and "random_seed" not in scheduler_arrays(unseeded, routed)
    one = parse_completion({"model": "m", "prompt": "a", "seed": 7})
    assert scheduler_arrays(one, routed)["random_seed"].tolist() == [[7]]

    outcomes = [Outcome(t, "infobench", "length", "", 5 if t < "b" else 2, 4) for t in call.prompts]
    reply = Reply(call).complete(outcomes)
    assert [c["index"] for c in reply["choices"]] == list(range(6))
    # each prompt's tokens once, every choice's completion
    assert reply["usage"] == {"prompt_tokens": 7, "completion_tokens": 24, "total_tokens": 31}


def config_inputs(path: Path) -> dict[str, str]:
    """{input name: data type} of a model config."""
    block = path.read_text().split("input [", 1)[1].split("]\noutput", 1)[0]
    return dict(re.findall(r'name: "(\w+)" data_type: TYPE_(\w+)', block))


def ensemble_step(model: str) -> tuple[dict[str, str], dict[str, str]]:
    """(input_map, output_map) of the ensemble's step calling `model`."""
    text = (ROOT / "ensemble" / "specbatch" / "config.pbtxt").read_text()
    step = text.split(f'model_name: "{model}"', 1)[1].split("model_name:", 1)[0]
    inputs = dict(re.findall(r'input_map \{ key: "(\w+)" value: "(\w+)" \}', step))
    outputs = dict(re.findall(r'output_map \{ key: "(\w+)" value: "(\w+)" \}', step))
    return inputs, outputs


def test_the_front_feeds_the_scheduler_what_the_ensemble_would():
    call = parse_chat(
        {
            "model": "m",
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
            "max_tokens": 4,
            "temperature": 0.5,
            "top_p": 0.5,
            "top_k": 3,
            "stop": ["x"],
            "stream": True,
            "self_refine": True,
            "seed": -1,
            "ignore_eos": True,
            "include_stop_str_in_output": True,
            "min_tokens": 2,
        }
    )
    routed = {
        "routed_task": np.array([[b"infobench"]], dtype=np.object_),
        "route_error": np.array([[b""]], dtype=np.object_),
    }
    arrays = scheduler_arrays(call, routed)
    assert arrays["self_refine"].tolist() == [[True]] and arrays["top_k"].tolist() == [[3]]
    assert arrays["random_seed"].tolist() == [[(1 << 64) - 1]], "a negative seed by its two's complement"
    _, router_out = ensemble_step("router")
    scheduler_in, _ = ensemble_step("scheduler")
    # the router's outputs reach the scheduler input of the same name, as in the ensemble
    assert set(ROUTER_OUTPUTS) == set(router_out)
    assert all(scheduler_in[name] == router_out[name] for name in ROUTER_OUTPUTS)
    # every other input is one the ensemble passes through unchanged, with the config's type
    passed_through = {key for key, value in scheduler_in.items() if key == value}
    assert set(arrays) - set(ROUTER_OUTPUTS) <= passed_through
    declared = config_inputs(ROOT / "model_repository" / "scheduler" / "config.pbtxt")
    for name, array in arrays.items():
        expected = {"STRING": "BYTES"}.get(declared[name], declared[name])
        assert triton_datatype(array.dtype) == expected, name
        assert array.shape[0] == 1, "one batch entry per request"


def test_a_call_waiting_on_a_scheduler_that_died_is_answered_503_and_its_stream_closed():
    import asyncio

    from specbatch.openai.app import _unless_failed
    from specbatch.serving.held import HeldRequests

    closed = []

    async def pipeline():
        try:
            yield "first"
            await asyncio.Event().wait()  # the dead scheduler never answers
        finally:
            closed.append(True)

    async def scenario():
        held = HeldRequests()
        with held.waiting() as failed:
            events = _unless_failed(pipeline(), failed)
            assert await anext(events) == "first"
            waiting = asyncio.ensure_future(anext(events))
            await asyncio.sleep(0)
            assert held.fail_all() == 1
            with pytest.raises(OpenAIError) as refused:
                await waiting
        assert refused.value.status == 503 and "scheduler failed" in refused.value.message
        assert closed == [True] and len(held) == 0

    asyncio.run(scenario())


def test_a_client_that_leaves_while_the_pipeline_is_read_ends_the_upstream_call():
    import asyncio

    from specbatch.openai.app import _unless_failed
    from specbatch.serving.held import HeldRequests

    closed = []

    async def pipeline():
        try:
            yield "first"
            await asyncio.Event().wait()
        finally:
            closed.append(True)  # upstream.run cancels the gRPC stream here

    async def consume(events) -> None:
        async for _ in events:
            pass

    async def scenario():
        with HeldRequests().waiting() as failed:
            handler = asyncio.ensure_future(consume(_unless_failed(pipeline(), failed)))
            while not handler.done() and not closed:
                await asyncio.sleep(0.01)
                if not handler.done():
                    handler.cancel()  # aiohttp cancels the handler of a client that left
            with pytest.raises(asyncio.CancelledError):
                await handler
        assert closed == [True]

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "message",
    [
        "in ensemble 'specbatch', Stub process 'router_0_0' is not healthy.",
        "Request for unknown model: 'scheduler' has no available versions",
        "the server is overloaded: 9 prompts are queued (limit 8); retry later",
        "Stream removed (Socket closed)",  # a KServe pod's tritonserver killed mid-stream (chaos, 2026-12-05)
    ],
)
def test_a_step_that_is_down_or_busy_is_a_503(message):
    assert from_pipeline(message).status == 503


def test_aiohttps_own_refusals_come_in_openais_error_format():
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from specbatch.openai.app import build_app

    async def scenario():
        async with TestClient(TestServer(build_app("127.0.0.1:1", ["specbatch"], 4))) as client:
            unknown = await client.post("/v1/embeddings", json={"model": "specbatch", "input": "x"})
            wrong_method = await client.get("/v1/chat/completions")
            too_large = await client.post("/v1/completions", data=b"x" * (2 * 1024 * 1024))
            models = await client.get("/v1/models")
            return [(r.status, await r.json()) for r in (unknown, wrong_method, too_large, models)]

    (unknown, wrong_method, too_large, models) = asyncio.run(scenario())
    assert unknown[0] == 404 and "POST /v1/embeddings" in unknown[1]["error"]["message"]
    assert "/v1/chat/completions" in unknown[1]["error"]["message"], "the refusal names what is served"
    assert wrong_method[0] == 405 and wrong_method[1]["error"]["message"].startswith("GET is not allowed")
    assert too_large[0] == 413 and "body size" in too_large[1]["error"]["message"]
    refused = (unknown, wrong_method, too_large)
    assert {body["error"]["type"] for _, body in refused} == {"invalid_request_error"}
    assert models[0] == 200 and [card["id"] for card in models[1]["data"]] == ["specbatch"]


def _routed_one() -> dict[str, np.ndarray]:
    return {
        "routed_task": np.array([[b"infobench"]], dtype=np.object_),
        "route_error": np.array([[b""]], dtype=np.object_),
    }


def test_logprobs_are_asked_of_the_pipeline_as_each_endpoint_spells_them():
    user = [{"role": "user", "content": "u"}]
    asked = {
        parse_completion({"model": "m", "prompt": "x", "logprobs": 3}).logprobs: 3,
        parse_completion({"model": "m", "prompt": "x", "logprobs": 0}).logprobs: 0,
        parse_chat({"model": "m", "messages": user, "logprobs": True, "top_logprobs": 5}).logprobs: 5,
        parse_chat({"model": "m", "messages": user, "logprobs": True}).logprobs: 0,
    }
    assert all(got == want for got, want in asked.items())
    for off in (
        parse_completion({"model": "m", "prompt": "x"}),
        parse_completion({"model": "m", "prompt": "x", "logprobs": None}),
        parse_chat({"model": "m", "messages": user, "logprobs": False, "top_logprobs": 0}),
    ):
        assert off.logprobs is None and "logprobs" not in scheduler_arrays(off, _routed_one())
    call = parse_chat({"model": "m", "messages": user, "logprobs": True, "top_logprobs": 2})
    assert scheduler_arrays(call, _routed_one())["logprobs"].tolist() == [[2]]
    for body, param in (
        ({"logprobs": 1}, "logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ):
        with pytest.raises(OpenAIError) as caught:
            parse_chat({"model": "m", "messages": user, **body})
        assert caught.value.body()["error"]["param"] == param


# The pipeline's token_logprobs of a two-token answer " Hi" + "!", one alternative each,
# as the instance writes them.
TOKEN_LOGPROBS = to_json(
    [TokenLogprob(7, -0.5, ((9, -0.25),)), TokenLogprob(3, -0.125, ((3, -0.125),))],
    {7: " Hi", 9: " Hey", 3: "!"}.__getitem__,
)


def test_a_completions_logprobs_list_tokens_offsets_and_the_chosen_token_among_its_alternatives():
    call = parse_completion({"model": "m", "prompt": ["a", "b"], "logprobs": 1})
    reply = Reply(call)
    outcomes = [
        Outcome(" Hi!", "infobench", "length", "", 3, 2, TOKEN_LOGPROBS),
        Outcome("submit_paths(...)", "graph", "stop", "", 0, 0),
    ]
    choices = reply.complete(outcomes)["choices"]
    assert choices[0]["logprobs"] == {
        "tokens": [" Hi", "!"],
        "token_logprobs": [-0.5, -0.125],
        "top_logprobs": [{" Hi": -0.5, " Hey": -0.25}, {"!": -0.125}],
        "text_offset": [0, 3],
    }
    assert choices[1]["logprobs"] is None, "a computed answer has no token log-probabilities"
    end = reply.chunk(0, None, "length", logprobs=reply.logprobs(outcomes[0]))
    assert end["choices"][0]["logprobs"] == choices[0]["logprobs"]


def test_a_streamed_completions_chunks_carry_their_tokens_logprobs_with_offsets_running_on():
    call = parse_completion({"model": "m", "prompt": ["a", "b"], "logprobs": 1, "stream": True})
    reply = Reply(call)
    first_token, second_token = (json.dumps([entry]) for entry in json.loads(TOKEN_LOGPROBS))
    first = reply.chunk_logprobs(first_token, 0)
    assert reply.chunk_logprobs(first_token, 1)["text_offset"] == [0], "each choice counts its own"
    second = reply.chunk_logprobs(second_token, 0)
    assert (first["tokens"], first["text_offset"]) == ([" Hi"], [0])
    assert (second["tokens"], second["text_offset"]) == (["!"], [3])
    assert reply.chunk_logprobs("[]", 0) is None, "a last chunk whose tokens all went before has none"
    assert reply.chunk_logprobs("", 0) is None


def test_a_chats_logprobs_list_each_token_with_its_bytes_and_alternatives():
    call = parse_chat({"model": "m", "messages": [{"role": "user", "content": "u"}], "logprobs": True})
    content = Reply(call).complete([Outcome(" Hi!", "infobench", "stop", "", 9, 2, TOKEN_LOGPROBS)])
    assert content["choices"][0]["logprobs"]["content"] == [
        {
            "token": " Hi",
            "logprob": -0.5,
            "bytes": [32, 72, 105],
            "top_logprobs": [{"token": " Hey", "logprob": -0.25, "bytes": [32, 72, 101, 121]}],
        },
        {
            "token": "!",
            "logprob": -0.125,
            "bytes": [33],
            "top_logprobs": [{"token": "!", "logprob": -0.125, "bytes": [33]}],
        },
    ]


def test_stop_token_ids_reach_the_scheduler_as_one_list_for_every_prompt():
    call = parse_completion({"model": "m", "prompt": ["x", "y"], "stop_token_ids": [7, 151645]})
    assert call.stop_token_ids == (7, 151645)
    routed = {name: np.repeat(array, 2, axis=1) for name, array in _routed_one().items()}
    assert scheduler_arrays(call, routed)["stop_token_ids"].tolist() == [[7, 151645]]
    plain = parse_completion({"model": "m", "prompt": "x"})
    assert "stop_token_ids" not in scheduler_arrays(plain, _routed_one())


def test_penalties_reach_the_scheduler_only_when_set():
    call = parse_chat(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "u"}],
            "presence_penalty": 1.5,
            "frequency_penalty": -0.5,
            "repetition_penalty": 1.1,
        }
    )
    arrays = scheduler_arrays(call, _routed_one())
    assert "min_p" not in arrays
    assert arrays["presence_penalty"].tolist() == [[1.5]] and arrays["frequency_penalty"].tolist() == [[-0.5]]
    assert arrays["repetition_penalty"].dtype == np.float32 and arrays["repetition_penalty"].shape == (1, 1)
    plain = scheduler_arrays(parse_completion({"model": "m", "prompt": "x"}), _routed_one())
    assert not {"presence_penalty", "frequency_penalty", "repetition_penalty"} & set(plain)


def test_min_p_reaches_the_scheduler_as_vllm_names_it():
    call = parse_completion({"model": "m", "prompt": "x", "min_p": 0.05, "temperature": 0.7})
    assert call.min_p == 0.05
    assert scheduler_arrays(call, _routed_one())["min_p"].tolist() == [[pytest.approx(0.05)]]


def _with_logprobs(text: str, values: list[float]) -> Outcome:
    tokens = [TokenLogprob(i, value) for i, value in enumerate(values)]
    return Outcome(text, "infobench", "length", "", 4, len(values), to_json(tokens, str))


def test_best_of_runs_every_copy_and_keeps_the_n_likeliest_of_each_prompt():
    call = parse_completion({"model": "m", "prompt": ["a", "b"], "best_of": 3, "n": 2, "temperature": 1})
    assert call.copies == 3 and call.prompts == ("a",) * 3 + ("b",) * 3
    arrays = scheduler_arrays(call, {k: np.repeat(v, 6, axis=1) for k, v in _routed_one().items()})
    assert arrays["logprobs"].tolist() == [[0]], "the pipeline reports what the copies are ranked by"
    outcomes = [
        _with_logprobs("a0", [-1.0, -1.0]),
        _with_logprobs("a1", [-0.5]),
        _with_logprobs("a2", [-0.2, -0.2]),
        _with_logprobs("b0", [-3.0]),
        _with_logprobs("b1", [-2.0]),
        _with_logprobs("b2", [-2.5]),
    ]
    reply = Reply(call).complete(outcomes)
    assert [c["text"] for c in reply["choices"]] == ["a2", "a1", "b1", "b2"]
    assert all(c["logprobs"] is None for c in reply["choices"]), "the client asked for none"
    assert reply["usage"] == {"prompt_tokens": 8, "completion_tokens": 8, "total_tokens": 16}, "every copy"
    assert parse_completion({"model": "m", "prompt": "x", "best_of": 1}).best_of is None


def test_echo_puts_each_prompt_before_its_completion():
    call = parse_completion({"model": "m", "prompt": ["Say hi.", "Say bye."], "echo": True, "n": 2})
    reply = Reply(call).complete([Outcome(t, "infobench", "stop", "", 3, 1) for t in ("1", "2", "3", "4")])
    assert [c["text"] for c in reply["choices"]] == ["Say hi.1", "Say hi.2", "Say bye.3", "Say bye.4"]
    for body in ({"echo": True}, {"best_of": 2}):
        with pytest.raises(OpenAIError) as caught:
            parse_chat({"model": "m", "messages": [{"role": "user", "content": "u"}], **body})
        assert caught.value.body()["error"]["param"] == next(iter(body))


def test_logit_bias_reaches_the_scheduler_as_ids_and_values():
    call = parse_completion({"model": "m", "prompt": "x", "logit_bias": {"50256": -100, "7": 2.5}})
    assert call.logit_bias == ((50256, -100.0), (7, 2.5))
    arrays = scheduler_arrays(call, _routed_one())
    assert arrays["logit_bias_ids"].tolist() == [[50256, 7]]
    assert arrays["logit_bias_values"].tolist() == [[-100.0, 2.5]]
    plain = parse_completion({"model": "m", "prompt": "x"})
    assert "logit_bias_ids" not in scheduler_arrays(plain, _routed_one())
