"""The OpenAI-compatible front, called with the official `openai` package against a real server."""

from __future__ import annotations

import json
import re
import time
import urllib.request

import numpy as np
import openai
import pytest
from helpers import (
    GRAPH_ANSWER,
    GRAPH_PROMPT,
    INFOBENCH_PROMPT,
    MMLU_DATASET_PROMPT,
    SEA_PROMPT,
    grpc_generate,
    metric_values,
    scrape,
)
from transformers import AutoTokenizer

from specbatch.server.children import OpenAIFrontProcess
from specbatch.server.ports import free_port

pytestmark = pytest.mark.integration

LONG_PROMPT = "Instruction: Tell a long story about the sea.\nQuestion: \nGeneration:"
ANSWER = re.compile(r"The answer is \(([A-E])\)")


@pytest.fixture(scope="module")
def client(openai_front) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{openai_front.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer(tiny_pair_dir):
    return AutoTokenizer.from_pretrained(tiny_pair_dir / "target")


def generate(server, prompts: list[str], max_tokens: int) -> dict:
    """The same prompts through the ensemble's gRPC stream, for comparison."""
    outputs, error = grpc_generate(
        server.grpc_url,
        {
            "text_input": np.array([p.encode() for p in prompts], dtype=np.object_),
            "max_tokens": np.array([max_tokens], dtype=np.int32),
        },
    )
    assert error is None
    return outputs


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["specbatch"]
    assert client.models.retrieve("specbatch").id == "specbatch"


def test_a_multi_prompt_completion_answers_in_order_like_the_ensemble(client, server):
    prompts = [GRAPH_PROMPT, MMLU_DATASET_PROMPT, INFOBENCH_PROMPT]
    reply = client.completions.create(model="specbatch", prompt=prompts, max_tokens=12, temperature=0)
    expected = generate(server, prompts, 12)

    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.text for c in reply.choices] == expected["text_output"]
    assert reply.choices[0].text == GRAPH_ANSWER
    assert ANSWER.fullmatch(reply.choices[1].text)
    assert [c.finish_reason for c in reply.choices] == expected["finish_reason"]
    assert reply.usage.prompt_tokens == sum(expected["num_input_tokens"]) > 0
    assert reply.usage.completion_tokens == sum(expected["num_output_tokens"]) > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_a_streamed_completion_adds_up_to_the_whole_one_with_usage_last(client):
    whole = client.completions.create(model="specbatch", prompt=INFOBENCH_PROMPT, max_tokens=24)
    chunks = list(
        client.completions.create(
            model="specbatch",
            prompt=INFOBENCH_PROMPT,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text_chunks = [c for c in chunks if c.choices and c.choices[0].text]
    assert len(text_chunks) > 1, "the text came in one piece"
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_applies_qwen3_template_in_the_instance(client, server, tokenizer):
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name three colours."},
    ]
    reply = client.chat.completions.create(model="specbatch", messages=messages, max_tokens=8)
    rendered = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert rendered.endswith("<think>\n\n</think>\n\n")
    assert reply.usage.prompt_tokens == len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    assert reply.choices[0].message.role == "assistant" and reply.choices[0].message.content
    assert 0 < reply.usage.completion_tokens <= 8

    thinking = client.chat.completions.create(
        model="specbatch",
        messages=messages,
        max_tokens=8,
        extra_body={"chat_template_kwargs": {"enable_thinking": True}},
    )
    think_block = len(tokenizer("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"])
    assert thinking.usage.prompt_tokens == reply.usage.prompt_tokens - think_block


def test_a_seed_makes_a_sampled_completion_reproducible(client):
    def sampled(seed: int) -> str:
        reply = client.completions.create(
            model="specbatch", prompt=INFOBENCH_PROMPT, max_tokens=16, temperature=1.0, seed=seed
        )
        return reply.choices[0].text

    first = sampled(-5)  # any 64-bit integer is a seed
    assert sampled(-5) == first
    assert sampled(11) != first


def test_n_choices_sample_each_prompt_n_times_reproducibly_and_stream_by_index(client):
    prompts = [INFOBENCH_PROMPT, SEA_PROMPT]
    sampling = {"model": "specbatch", "max_tokens": 12, "temperature": 1.0, "seed": 7}
    reply = client.completions.create(prompt=prompts, n=2, **sampling)
    alone = [client.completions.create(prompt=prompt, **sampling) for prompt in prompts]

    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    # copy 0 of each prompt is the answer n = 1 gives; copy 1 samples on a seed of its own
    assert [reply.choices[0].text, reply.choices[2].text] == [a.choices[0].text for a in alone]
    assert reply.choices[1].text != reply.choices[0].text
    assert reply.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    again = client.completions.create(prompt=prompts, n=2, **sampling)
    assert [c.text for c in again.choices] == [c.text for c in reply.choices]

    streamed: dict[int, str] = {}
    for chunk in client.completions.create(prompt=prompts, n=2, stream=True, **sampling):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert [streamed[i] for i in range(4)] == [c.text for c in reply.choices]

    chat = client.chat.completions.create(
        model="specbatch", messages=[{"role": "user", "content": "Name three colours."}], n=3, max_tokens=8
    )
    assert [c.index for c in chat.choices] == [0, 1, 2]
    assert len({c.message.content for c in chat.choices}) == 1, "greedy copies are one answer"
    roles: dict[int, str] = {}
    texts: dict[int, str] = {}
    for chunk in client.chat.completions.create(
        model="specbatch",
        messages=[{"role": "user", "content": "Name three colours."}],
        n=3,
        max_tokens=8,
        stream=True,
    ):
        for choice in chunk.choices:
            if choice.delta.role:
                assert choice.index not in texts, "a choice's role comes before its text"
                roles[choice.index] = choice.delta.role
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert roles == dict.fromkeys(range(3), "assistant")
    assert [texts[i] for i in range(3)] == [c.message.content for c in chat.choices]


def test_ignore_eos_runs_a_completion_to_max_tokens(client):
    plain = client.completions.create(model="specbatch", prompt=SEA_PROMPT, max_tokens=24)
    assert plain.choices[0].finish_reason == "stop" and plain.usage.completion_tokens < 24
    chunks = list(
        client.completions.create(
            model="specbatch",
            prompt=SEA_PROMPT,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    assert text.startswith(plain.choices[0].text) and len(text) > len(plain.choices[0].text)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 24
    # what load testers send for fixed lengths
    fixed = client.completions.create(
        model="specbatch", prompt=SEA_PROMPT, max_tokens=24, extra_body={"ignore_eos": True, "min_tokens": 24}
    )
    assert fixed.usage.completion_tokens == 24 and fixed.choices[0].text == text
    # vLLM's min_tokens alone: end of sequence is banned before it
    least = plain.usage.completion_tokens + 2
    held = client.completions.create(
        model="specbatch", prompt=SEA_PROMPT, max_tokens=24, extra_body={"min_tokens": least}
    )
    assert least <= held.usage.completion_tokens <= 24
    assert held.choices[0].text.startswith(plain.choices[0].text), "the same up to where it ended"
    with pytest.raises(openai.BadRequestError, match="min_tokens"):
        client.completions.create(
            model="specbatch", prompt=SEA_PROMPT, max_tokens=24, extra_body={"min_tokens": 25}
        )


def _without_end_of_sequence(tokens: list[str], finish_reason: str, tokenizer) -> str:
    """The text of the listed tokens less a closing end-of-sequence token, which is listed
    (it was generated and counts) but not in the text."""
    if finish_reason == "stop":
        assert tokens[-1] in tokenizer.all_special_tokens
        tokens = tokens[:-1]
    return "".join(tokens)


def test_logprobs_give_each_generated_token_the_targets_log_probability(client, server, tokenizer):
    reply = client.completions.create(
        model="specbatch", prompt=[SEA_PROMPT, GRAPH_PROMPT], max_tokens=12, temperature=0, logprobs=3
    )
    generated, computed = reply.choices
    assert computed.text == GRAPH_ANSWER and computed.logprobs is None, "computed, not generated"
    lp = generated.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == reply.usage.completion_tokens
    assert _without_end_of_sequence(lp.tokens, generated.finish_reason, tokenizer) == generated.text
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value <= 0 and top[token] == value == max(top.values()), "greedy: the likeliest token"
        assert len(top) == 3
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]

    # streamed: each chunk with its own tokens', the offsets running on, adding up to the same
    chunks = [
        c.choices[0]
        for c in client.completions.create(
            model="specbatch", prompt=SEA_PROMPT, max_tokens=12, temperature=0, logprobs=3, stream=True
        )
    ]
    assert all(c.logprobs and c.logprobs.tokens for c in chunks if c.text), "every chunk of text its tokens'"
    pieces = [c.logprobs for c in chunks if c.logprobs]
    assert len(pieces) > 1, "the log-probabilities came chunk by chunk"
    for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [value for piece in pieces for value in getattr(piece, name)] == getattr(lp, name), name

    # the ensemble's own output, over /generate: the same tokens and values, as JSON
    body = {"text_input": [SEA_PROMPT, GRAPH_PROMPT], "max_tokens": 12, "temperature": [0.0], "logprobs": [3]}
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/specbatch/generate", data=json.dumps(body).encode()
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        outputs = json.load(answer)["token_logprobs"]
    assert outputs[1] == "", "the graph prompt's answer was computed"
    entries = json.loads(outputs[0])
    assert [e["token"] for e in entries] == lp.tokens and [e["logprob"] for e in entries] == lp.token_logprobs
    assert all(len(e["top_logprobs"]) == 3 and e["top_logprobs"][0]["id"] == e["id"] for e in entries)

    # vLLM's stop_token_ids: the answer ends at the first such token (the ids from above)
    ids = [e["id"] for e in entries]
    stop_at = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])
    cut = client.completions.create(
        model="specbatch",
        prompt=SEA_PROMPT,
        max_tokens=12,
        temperature=0,
        extra_body={"stop_token_ids": [ids[stop_at]]},
    ).choices[0]
    assert (cut.text, cut.finish_reason) == ("".join(e["token"] for e in entries[: stop_at + 1]), "stop")

    # a stop string: left out of the text, or kept with vLLM's include_stop_str_in_output
    stop = generated.text[len(generated.text) // 2 :][:3]
    options = {"model": "specbatch", "prompt": SEA_PROMPT, "max_tokens": 12, "temperature": 0, "stop": [stop]}
    before = client.completions.create(**options).choices[0]
    kept = client.completions.create(extra_body={"include_stop_str_in_output": True}, **options).choices[0]
    assert before.text == generated.text[: generated.text.find(stop)] and before.finish_reason == "stop"
    assert kept.text == before.text + stop and kept.finish_reason == "stop"

    # OpenAI's logit_bias: +100 makes a token every token, -100 bans one
    options = {"model": "specbatch", "prompt": SEA_PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 0}
    forced = client.completions.create(logit_bias={str(ids[stop_at]): 100}, **options).choices[0]
    assert forced.logprobs.tokens == [entries[stop_at]["token"]] * 4
    banned = client.completions.create(logit_bias={str(ids[0]): -100}, **options).choices[0]
    assert banned.logprobs.tokens[0] != entries[0]["token"]

    # a streamed chat: each chunk with the log-probabilities of the tokens it completes
    chunks = list(
        client.chat.completions.create(
            model="specbatch",
            messages=[{"role": "user", "content": SEA_PROMPT}],
            max_tokens=12,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    choices = [c.choices[0] for c in chunks if c.choices]
    content = [t for choice in choices if choice.logprobs for t in choice.logprobs.content]
    assert len(content) == chunks[-1].usage.completion_tokens > 0
    listed = _without_end_of_sequence([t.token for t in content], choices[-1].finish_reason, tokenizer)
    assert listed == "".join(choice.delta.content or "" for choice in choices)
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob == t.logprob for t in content)
    assert all(bytes(t.bytes).decode() == t.token for t in content)
    assert all(c.logprobs and c.logprobs.content for c in choices if c.delta.content), "chunk by chunk"


def test_a_presence_penalty_decodes_the_likeliest_token_after_it(client, server):
    # negative: the tiny model's answer to SEA_PROMPT repeats no token in 24, so a
    # positive penalty would never act there
    body = {
        "text_input": [SEA_PROMPT, SEA_PROMPT],
        "max_tokens": 24,
        "temperature": [0.0],
        "logprobs": [20],
        "presence_penalty": [-2.0, 0.0],
        "ignore_eos": [True],
    }
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/specbatch/generate", data=json.dumps(body).encode()
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        outputs = json.load(answer)
    penalized, plain = (json.loads(text) for text in outputs["token_logprobs"])
    for j, entry in enumerate(penalized):
        seen = {e["id"] for e in penalized[:j]}
        after = {a["id"]: a["logprob"] + 2.0 * (a["id"] in seen) for a in entry["top_logprobs"]}
        assert entry["logprob"] + 2.0 * (entry["id"] in seen) >= max(after.values()), j
    assert all(e["id"] == e["top_logprobs"][0]["id"] for e in plain), "no penalty: the raw argmax"
    assert [e["id"] for e in penalized] != [e["id"] for e in plain], "the penalty acted"
    over_openai = client.completions.create(
        model="specbatch",
        prompt=SEA_PROMPT,
        max_tokens=24,
        temperature=0,
        presence_penalty=-2.0,
        extra_body={"ignore_eos": True},
    )
    assert over_openai.choices[0].text == outputs["text_output"][0]


def test_min_p_of_one_samples_only_the_likeliest_token(client):
    options = {"model": "specbatch", "prompt": SEA_PROMPT, "max_tokens": 12}
    greedy = client.completions.create(temperature=0, **options).choices[0].text
    sampled = client.completions.create(temperature=1.0, extra_body={"min_p": 1.0}, **options).choices[0].text
    assert sampled == greedy


def test_echo_and_best_of_as_vllm_serves_them(client):
    options = {"model": "specbatch", "prompt": SEA_PROMPT, "max_tokens": 8}
    plain = client.completions.create(temperature=0, **options).choices[0].text
    echoed = client.completions.create(temperature=0, echo=True, **options)
    assert echoed.choices[0].text == SEA_PROMPT + plain
    streamed = client.completions.create(temperature=0, echo=True, stream=True, **options)
    assert "".join(chunk.choices[0].text for chunk in streamed) == SEA_PROMPT + plain
    best = client.completions.create(temperature=1.0, seed=5, best_of=4, n=2, logprobs=0, **options)
    totals = [sum(c.logprobs.token_logprobs) for c in best.choices]
    assert len(totals) == 2 and totals[0] >= totals[1], "the likeliest copies, likeliest first"
    assert best.usage.completion_tokens > sum(len(c.logprobs.tokens) for c in best.choices), "all four"


def test_chat_routes_like_generate(client):
    graph = client.chat.completions.create(
        model="specbatch", messages=[{"role": "user", "content": GRAPH_PROMPT}], max_tokens=16
    )
    assert graph.choices[0].message.content == GRAPH_ANSWER
    assert graph.usage.prompt_tokens == graph.usage.completion_tokens == 0, "computed: no model read it"
    mmlu = client.chat.completions.create(
        model="specbatch", messages=[{"role": "user", "content": MMLU_DATASET_PROMPT}], max_tokens=16
    )
    assert ANSWER.fullmatch(mmlu.choices[0].message.content)
    assert mmlu.usage.prompt_tokens > 0, "the target read the prompt to score its choices"
    assert mmlu.usage.completion_tokens == 0, "scored, not generated"


def test_streamed_chat_sends_the_role_then_content_then_the_end(client):
    chunks = list(
        client.chat.completions.create(
            model="specbatch",
            messages=[{"role": "user", "content": GRAPH_PROMPT}],
            max_tokens=16,
            stream=True,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == GRAPH_ANSWER
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_stop_string_ends_the_text_before_it(client):
    whole = client.completions.create(model="specbatch", prompt=INFOBENCH_PROMPT, max_tokens=24).choices[0]
    stop = whole.text[len(whole.text) // 2 :][:3]
    assert stop.strip(), whole.text
    cut = client.completions.create(model="specbatch", prompt=INFOBENCH_PROMPT, max_tokens=24, stop=[stop])
    assert cut.choices[0].text == whole.text[: whole.text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model="specbatch", prompt=INFOBENCH_PROMPT, max_tokens=24, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == cut.choices[0].text


@pytest.mark.parametrize(
    ("arguments", "param"),
    [
        ({"prompt": INFOBENCH_PROMPT, "max_tokens": 0}, "max_tokens"),
        ({"prompt": INFOBENCH_PROMPT, "n": 0}, "n"),
        ({"prompt": INFOBENCH_PROMPT, "temperature": -1}, "temperature"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"prompt": INFOBENCH_PROMPT, "logprobs": 21}, "logprobs"),
    ],
)
def test_a_bad_request_gets_a_400_in_openai_format(client, arguments, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="specbatch", **arguments)
    assert caught.value.status_code == 400
    assert caught.value.body["type"] == "invalid_request_error" and caught.value.body["param"] == param


def test_a_prompt_the_pipeline_refuses_gets_a_400_with_its_reason(client):
    with pytest.raises(openai.BadRequestError, match="prompt is empty"):
        client.completions.create(model="specbatch", prompt="   ", max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="prompt 1: prompt is empty"):
        client.completions.create(model="specbatch", prompt=[INFOBENCH_PROMPT, " "], max_tokens=4)
    # a prompt of n choices is named once, by its place among the prompts
    with pytest.raises(openai.BadRequestError, match=r"- prompt 1: prompt is empty$"):
        client.completions.create(model="specbatch", prompt=[INFOBENCH_PROMPT, " "], n=3, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match=r"- prompt is empty$"):
        client.completions.create(model="specbatch", prompt=" ", n=2, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="last message"):
        client.chat.completions.create(model="specbatch", messages=[{"role": "assistant", "content": "x"}])
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt=INFOBENCH_PROMPT)


def cancelled_prompts(server) -> float:
    counts = metric_values(scrape(server.metrics_url), "specbatch_prompts_total")
    return sum(v for k, v in counts.items() if 'finish_reason="cancelled"' in k)


def test_a_client_that_disconnects_mid_stream_frees_its_row(client, server):
    before = cancelled_prompts(server)
    stream = client.completions.create(model="specbatch", prompt=LONG_PROMPT, max_tokens=400, stream=True)
    first = next(iter(stream))
    assert first.choices[0].finish_reason is None
    stream.close()
    deadline = time.monotonic() + 10
    while cancelled_prompts(server) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cancelled_prompts(server) == before + 1, "the row kept generating after the client left"


def test_past_its_bound_the_front_answers_503_at_once(server, tmp_path):
    front = OpenAIFrontProcess(server.grpc_url, free_port(), "127.0.0.1", "--max-pending=1")
    front.start(tmp_path / "front.log")
    try:
        front.wait_ready()
        client = openai.OpenAI(base_url=f"{front.url}/v1", api_key="unused", max_retries=0)
        busy = client.completions.create(model="specbatch", prompt=LONG_PROMPT, max_tokens=200, stream=True)
        next(iter(busy))
        started = time.monotonic()
        with pytest.raises(openai.InternalServerError) as caught:
            client.completions.create(model="specbatch", prompt=INFOBENCH_PROMPT, max_tokens=4)
        assert time.monotonic() - started < 5.0, "the front queued instead of refusing"
        assert caught.value.status_code == 503 and caught.value.body["code"] == "overloaded"
        busy.close()
    finally:
        front.stop()


def test_health_reports_the_server_ready(openai_front):
    with urllib.request.urlopen(f"{openai_front.url}/health", timeout=10) as reply:
        assert reply.status == 200 and json.load(reply) == {"ready": True}
