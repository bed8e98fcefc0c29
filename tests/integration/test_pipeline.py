"""The whole pipeline on a real tritonserver, called with real clients."""

from __future__ import annotations

import json
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest
from helpers import (
    GRAPH_ANSWER,
    GRAPH_PROMPT,
    INFOBENCH_DATASET_PROMPT,
    INFOBENCH_PROMPT,
    MMLU_DATASET_PROMPT,
    MMLU_PROMPT,
    SEA_PROMPT,
    grpc_generate,
    metric_values,
    scrape,
)
from serving_helpers import within_rounding
from specbatch_client import GenerationOptions, ServerError, SpecbatchClient

pytestmark = pytest.mark.integration

MIXED = [GRAPH_PROMPT, MMLU_PROMPT, INFOBENCH_PROMPT, MMLU_DATASET_PROMPT, INFOBENCH_DATASET_PROMPT]
EXPECTED_TASKS = ["graph", "mmlu", "infobench", "mmlu", "infobench"]


def client_for(server, protocol: str) -> SpecbatchClient:
    return SpecbatchClient(server.http_url if protocol == "http" else server.grpc_url, protocol)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_mixed_request_answers_every_prompt_in_order(server, protocol):
    answers = client_for(server, protocol).generate(MIXED, GenerationOptions(max_tokens=12))

    assert [a.task for a in answers] == EXPECTED_TASKS
    assert all(a.error == "" for a in answers)
    assert answers[0].text == GRAPH_ANSWER
    for answer, letters in ((answers[1], "ABCD"), (answers[3], "ABCDE")):
        match = re.fullmatch(r"The answer is \(([A-Z])\)", answer.text)
        assert match and match.group(1) in letters
        assert answer.num_input_tokens > 0, "a scoring reads its prompt"
        assert answer.num_output_tokens == 0, "a scoring generates nothing"
    assert answers[0].num_input_tokens == answers[0].num_output_tokens == 0, "no model reads a graph"
    for answer in (answers[2], answers[4]):
        assert answer.text.strip()
        assert answer.finish_reason in ("stop", "length")
        assert 0 < answer.num_output_tokens <= 12
        assert answer.num_input_tokens > 0
        assert answer.total_draft_tokens > 0
        assert 0 <= answer.total_accepted_draft_tokens <= answer.total_draft_tokens
        assert answer.acceptance_rate == pytest.approx(
            answer.total_accepted_draft_tokens / answer.total_draft_tokens
        )


def test_greedy_output_through_the_server_equals_engine_target_only(server, tiny_pair_dir):
    from specbatch.decoding import Engine, GenerationRequest, load_model_pair
    from specbatch.routing import build_infobench_prompt

    prompts = [INFOBENCH_PROMPT, INFOBENCH_DATASET_PROMPT]
    answers = client_for(server, "http").generate(prompts, GenerationOptions(max_tokens=24, temperature=0.0))

    pair = load_model_pair(str(tiny_pair_dir / "target"), str(tiny_pair_dir / "draft"), device="cpu")
    reference = Engine(pair).generate(
        [GenerationRequest(prompt=build_infobench_prompt(p), max_new_tokens=24) for p in prompts],
        mode="target_only",
    )
    assert [a.text for a in answers] == [r.text for r in reference]
    assert [a.num_output_tokens for a in answers] == [r.num_output_tokens for r in reference]
    assert all(a.total_draft_tokens > 0 for a in answers)


def test_a_seeded_sampled_prompt_is_the_targets_own_seeded_draw_in_any_company(server, tiny_pair_dir):
    """random_seed makes sampling reproducible through the pipeline: alone or beside other
    prompts, over HTTP or gRPC, the answer is the target-only seeded output."""
    from specbatch.decoding import Engine, GenerationRequest, load_model_pair
    from specbatch.routing import build_infobench_prompt

    options = GenerationOptions(max_tokens=24, temperature=1.0, top_p=0.95, random_seed=(1 << 64) - 3)
    alone = client_for(server, "http").generate([INFOBENCH_PROMPT], options)[0]
    # six prompts on two instances: the seeded rows run in batches with others
    crowd = [INFOBENCH_DATASET_PROMPT, INFOBENCH_PROMPT] * 3
    company = client_for(server, "grpc").generate(crowd, options)

    pair = load_model_pair(str(tiny_pair_dir / "target"), str(tiny_pair_dir / "draft"), device="cpu")
    [reference] = Engine(pair).generate(
        [
            GenerationRequest(
                prompt=build_infobench_prompt(INFOBENCH_PROMPT),
                max_new_tokens=24,
                temperature=1.0,
                top_p=0.95,
                seed=(1 << 64) - 3,
            )
        ],
        mode="target_only",
    )
    assert alone.text == company[1].text == company[3].text == company[5].text == reference.text
    assert alone.total_draft_tokens > 0, "speculated, and still the target's own draw"
    other_seed = GenerationOptions(max_tokens=24, temperature=1.0, top_p=0.95, random_seed=7)
    assert client_for(server, "http").generate([INFOBENCH_PROMPT], other_seed)[0].text != alone.text


def test_ignore_eos_runs_a_prompt_to_its_max_tokens_through_end_of_sequence(server):
    """ignore_eos, per prompt ([N]) over /generate and for the request ([1]) over gRPC: the
    prompt that ends at end-of-sequence by itself runs on to max_tokens, its text the
    same up to that end; its neighbour in the request still stops."""
    body = {"text_input": [SEA_PROMPT, SEA_PROMPT], "max_tokens": 24, "ignore_eos": [True, False]}
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/specbatch/generate", data=json.dumps(body).encode()
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        answer = json.load(reply)
    assert answer["finish_reason"] == ["length", "stop"]
    ignoring, stopping = answer["text_output"]
    assert answer["num_output_tokens"][0] == 24 and answer["num_output_tokens"][1] < 24
    assert ignoring.startswith(stopping) and len(ignoring) > len(stopping)
    options = GenerationOptions(max_tokens=24, ignore_eos=True)
    [over_grpc] = client_for(server, "grpc").generate([SEA_PROMPT], options)
    assert (over_grpc.text, over_grpc.finish_reason, over_grpc.num_output_tokens) == (ignoring, "length", 24)

    # min_tokens ([1], for every prompt): end of sequence is banned before it (vLLM's), so
    # none ends before it, each the stopping prompt's text up to where that one ended
    least = answer["num_output_tokens"][1] + 2
    body = {"text_input": [SEA_PROMPT, SEA_PROMPT], "max_tokens": 24, "min_tokens": [least]}
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/specbatch/generate", data=json.dumps(body).encode()
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        held = json.load(reply)
    assert all(least <= n <= 24 for n in held["num_output_tokens"])
    assert all(text.startswith(stopping) for text in held["text_output"]), "the model's own tokens"
    [held_over_grpc] = client_for(server, "grpc").generate(
        [SEA_PROMPT], GenerationOptions(max_tokens=24, min_tokens=least)
    )
    assert held_over_grpc.text == held["text_output"][0]


def router_counts(server) -> tuple[int, int]:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/router/stats") as reply:
        stats = json.load(reply)["model_stats"][0]
    return stats["inference_count"], stats["execution_count"]


def test_concurrent_load_is_batched_over_both_instances(server):
    client = client_for(server, "http")
    before = scrape(server.metrics_url)
    inferences_before, executions_before = router_counts(server)
    prompts = [
        f"Instruction: Give tip number {i} for sleeping well.\nQuestion: \nGeneration:" for i in range(24)
    ]
    with ThreadPoolExecutor(max_workers=24) as pool:
        answers = list(pool.map(lambda p: client.generate(p, GenerationOptions(max_tokens=16))[0], prompts))
    after = scrape(server.metrics_url)
    inferences_after, executions_after = router_counts(server)

    assert all(a.error == "" and a.num_output_tokens > 0 for a in answers)
    assert executions_after - executions_before < inferences_after - inferences_before, (
        "Triton's dynamic batcher never gave the router more than one request at a time"
    )

    admitted = {
        label: value - metric_values(before, "specbatch_admitted_prompts_total").get(label, 0.0)
        for label, value in metric_values(after, "specbatch_admitted_prompts_total").items()
    }
    assert sum(admitted.values()) == 24
    assert len(admitted) == 2 and all(v > 0 for v in admitted.values()), admitted
    assert {a.model_instance for a in answers} == {"qwen3_specdec_0_0", "qwen3_specdec_0_1"}


def test_bad_prompts_fail_alone_while_the_rest_is_served(server):
    long_prompt = "Instruction: " + "repeat this sentence please. " * 1500 + "\nQuestion: \nGeneration:"
    prompts = [
        INFOBENCH_PROMPT,
        "",
        b"\xff\xfe bad bytes",
        long_prompt,
        GRAPH_PROMPT,
        INFOBENCH_PROMPT,
        INFOBENCH_PROMPT,
        INFOBENCH_PROMPT,
        INFOBENCH_PROMPT,
        INFOBENCH_PROMPT,
    ]
    count = len(prompts)
    max_tokens = np.full(count, 8, dtype=np.int32)
    max_tokens[5], max_tokens[6] = 0, 100_000
    temperature = np.zeros(count, dtype=np.float32)
    temperature[7], temperature[8] = -1.0, np.nan
    overrides = np.array([b""] * count, dtype=np.object_)
    overrides[9] = b"poetry"
    inputs = {
        "text_input": np.array(
            [p if isinstance(p, bytes) else p.encode() for p in prompts], dtype=np.object_
        ),
        "max_tokens": max_tokens,
        "temperature": temperature,
        "task_override": overrides,
    }
    outputs, error = grpc_generate(server.grpc_url, inputs)

    assert error is None
    errors = outputs["error"]
    assert outputs["finish_reason"][0] == "length" and errors[0] == "" and outputs["text_output"][0]
    assert outputs["text_output"][4] == GRAPH_ANSWER and errors[4] == ""
    expected = {
        1: "empty",
        2: "UTF-8",
        3: "context",
        5: "positive",
        6: "cap",
        7: "temperature",
        8: "temperature",
        9: "unknown task",
    }
    for index, fragment in expected.items():
        assert outputs["finish_reason"][index] == "error", index
        assert fragment in errors[index], (index, errors[index])


def test_a_request_whose_only_prompt_is_bad_gets_a_triton_error(server):
    for protocol in ("http", "grpc"):
        with pytest.raises(ServerError, match="max_tokens must be positive"):
            client_for(server, protocol).generate(INFOBENCH_PROMPT, GenerationOptions(max_tokens=0))
        with pytest.raises(ServerError, match="empty"):
            client_for(server, protocol).generate("   ")


def test_metrics_endpoint_publishes_the_custom_families(server):
    client_for(server, "http").generate([GRAPH_PROMPT, INFOBENCH_PROMPT], GenerationOptions(max_tokens=4))
    text = scrape(server.metrics_url)
    for family in (
        "specbatch_queue_depth",
        "specbatch_running_rows",
        "specbatch_rows_allowed",
        "specbatch_b_sla_pace_seconds",
        "specbatch_admitted_prompts_total",
        "specbatch_routed_prompts_total",
        "specbatch_draft_tokens_total",
        "specbatch_accepted_draft_tokens_total",
        "specbatch_prompts_total",
        "specbatch_free_kv_blocks",
        "specbatch_step_seconds_total",
        "specbatch_cycle_seconds_total",
        "specbatch_batch_steps_total",
        "specbatch_batch_step_seconds_total",
        "specbatch_batch_decode_step_seconds_squared_total",
        "specbatch_batch_context_slots_total",
    ):
        assert metric_values(text, family), family
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready") as reply:
        assert reply.status == 200


def test_ambiguous_prompts_are_routed_by_the_draft_model(server):
    def ambiguous() -> float:
        routed = metric_values(scrape(server.metrics_url), "specbatch_routed_prompts_total")
        return sum(v for label, v in routed.items() if 'task="ambiguous"' in label)

    before = ambiguous()
    [answer] = client_for(server, "http").generate(
        "Here are my options:\nA. speed\nB. cost", GenerationOptions(max_tokens=4)
    )
    assert ambiguous() == before + 1
    assert answer.model_instance  # the draft model ran on an instance to place it
    assert answer.task in ("graph", "mmlu", "infobench")
    assert answer.error == "" or answer.task == "graph"


def test_logprobs_and_penalties_reach_the_pipeline_over_http_and_grpc(server):
    options = GenerationOptions(max_tokens=10, temperature=0.0, logprobs=2)
    prompts = [SEA_PROMPT, GRAPH_PROMPT]
    over_http, over_grpc = (client_for(server, p).generate(prompts, options) for p in ("http", "grpc"))
    assert [(a.text, a.token_logprobs) for a in over_http] == [(a.text, a.token_logprobs) for a in over_grpc]
    generated, computed = over_http
    assert computed.token_logprobs is None, "a computed answer has no token log-probabilities"
    assert len(generated.token_logprobs) == generated.num_output_tokens
    for entry in generated.token_logprobs:
        best = entry["top_logprobs"][0]
        assert len(entry["top_logprobs"]) == 2
        assert (best["id"], best["logprob"]) == (entry["id"], entry["logprob"]), "greedy: the likeliest token"
    silent_options = GenerationOptions(max_tokens=10, temperature=0.0)
    [silent] = client_for(server, "grpc").generate([SEA_PROMPT], silent_options)
    assert silent.token_logprobs is None and silent.text == generated.text
    penalized = GenerationOptions(
        max_tokens=10, temperature=0.0, presence_penalty=-2.0, repetition_penalty=0.9
    )
    texts = {client_for(server, p).generate([SEA_PROMPT], penalized)[0].text for p in ("http", "grpc")}
    assert len(texts) == 1 and generated.text not in texts, "the penalties reached the model, over both"


def test_stop_strings_stop_token_ids_and_logit_bias_reach_the_pipeline_over_http_and_grpc(server):
    """Each option as the client sends it: the answer ends before a stop string (after it,
    asked to keep it), at a stop token, or starts with another token than the banned one."""
    base = GenerationOptions(max_tokens=12, temperature=0.0, logprobs=0, ignore_eos=True)
    [plain] = client_for(server, "http").generate([SEA_PROMPT], base)
    ids = [entry["id"] for entry in plain.token_logprobs]
    stop_text = plain.text[len(plain.text) // 2 :][:3]
    stop_id = ids[2]
    cases = {
        "stop": (replace(base, stop=[stop_text]), plain.text[: plain.text.find(stop_text)]),
        "stop_kept": (
            replace(base, stop=[stop_text], include_stop_str_in_output=True),
            plain.text[: plain.text.find(stop_text) + len(stop_text)],
        ),
        "stop_token_ids": (replace(base, stop_token_ids=[stop_id]), ids[: ids.index(stop_id) + 1]),
        "logit_bias": (replace(base, logit_bias={ids[0]: -100.0}), ids[0]),
    }
    for name, (options, expected) in cases.items():
        over_http, over_grpc = (
            client_for(server, protocol).generate([SEA_PROMPT], options)[0] for protocol in ("http", "grpc")
        )
        assert over_http.text == over_grpc.text, name
        assert within_rounding(over_http.token_logprobs, over_grpc.token_logprobs), name
        got = [entry["id"] for entry in over_http.token_logprobs]
        if name in ("stop", "stop_kept"):
            assert over_http.text == expected and over_http.finish_reason == "stop", (name, over_http)
        elif name == "stop_token_ids":
            assert got == expected and over_http.finish_reason == "stop", (name, over_http)
        else:
            assert got[0] != expected and over_http.text != plain.text, (name, over_http)
