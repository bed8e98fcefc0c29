"""Streaming: text deltas from tokens, a request's deltas and final response, latency accounting."""

from __future__ import annotations

import pytest
from serving_helpers import RecordingReply, word_target

from specbatch.routing import solve_graph
from specbatch.serving.instance.detokenize import IncrementalDetokenizer
from specbatch.serving.latency import PromptTiming, SlaTargets
from specbatch.serving.messages import RowOutcome
from specbatch.serving.params import ServingLimits
from specbatch.serving.scheduler.intake import RequestIntake, RoutedRequest

GRAPH = (
    "You are given a directed graph with 2 nodes (numbered 0 to 1) and the following edges:\n"
    "Edges (source -> target, weight):\n0 -> 1, weight: 4\n"
    "Find the top 1 shortest path(s) from node 0 to node 1.\n"
    "Call submit_paths(paths=[[...]], weights=[...])."
)
MMLU = "Question:\nWhich organ produces insulin?\n\nChoices:\nA. Liver\nB. Pancreas\nC. Kidney"
TEXT = "Grüße aus Zürich — naïve café, 東京 and 🙂 emoji;  double  spaces\nnew line"


def test_deltas_rebuild_the_text_exactly_without_broken_characters(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert tokenizer.decode(ids) == TEXT
    detok = IncrementalDetokenizer(lambda chunk: tokenizer.decode(chunk, skip_special_tokens=True))
    deltas = [detok.push([token]) for token in ids]
    deltas.append(detok.finish(tokenizer.decode(ids)))
    assert "".join(deltas) == TEXT
    assert not any("\ufffd" in d for d in deltas)
    assert sum(1 for d in deltas if d) > 10, "text arrived in one piece instead of streaming"


def test_multibyte_characters_are_held_until_complete(tokenizer):
    ids = tokenizer.encode("🙂", add_special_tokens=False)
    detok = IncrementalDetokenizer(lambda chunk: tokenizer.decode(chunk))
    pieces = [detok.push([t]) for t in ids]
    assert "".join(pieces) == "🙂" and all(p in ("", "🙂") for p in pieces)


def test_latency_and_sla_violations():
    timing = PromptTiming(
        arrival_s=10.0, done_s=12.0, dispatched_s=10.5, first_token_s=11.0, output_tokens=11
    )
    assert (timing.queue_s, timing.ttft_s, timing.e2e_s) == (0.5, 1.0, 2.0)
    assert timing.tpot_s == pytest.approx(0.1)
    assert SlaTargets(ttft_s=0.5, tpot_s=0.2, e2e_s=1.5).violations(timing) == ["ttft", "e2e"]
    assert PromptTiming(arrival_s=0.0, done_s=1.0).ttft_s is None
    assert SlaTargets(ttft_s=0.1).violations(PromptTiming(arrival_s=0.0, done_s=1.0)) == []


def make_intake(clock_s: float, stream_interval_s: float = 0.0) -> RequestIntake:
    return RequestIntake(
        ServingLimits(max_tokens_cap=32, default_max_tokens=8),
        word_target(64),
        lambda: clock_s,
        stream_interval_s=stream_interval_s,
    )


def test_a_streaming_request_sends_every_prompt_s_text_as_deltas_then_one_final():
    intake = make_intake(1.0)
    reply = RecordingReply()
    request = RoutedRequest(
        prompts=["Instruction: hi\nQuestion: \nGeneration:", GRAPH, MMLU],
        tasks=["infobench", "graph", "mmlu"],
        stream=True,
    )
    state, failures = intake.receive(request, reply)
    generate, graph, score = state.prompts
    assert failures == [] and state.stream and generate.sampling.stream

    graph.settle(RowOutcome(solve_graph(GRAPH)), 1.5)
    assert reply.deltas == [(1, "graph", "submit_paths(paths=[[0, 1]], weights=[4])")]
    generate.first_token(2.0)
    generate.stream_text("Hel", 2.0)
    generate.stream_text("", 2.2)
    generate.first_token(2.5)
    generate.stream_text("lo", 2.5)
    assert generate.streamed and not score.streamed
    generate.settle(RowOutcome("Hello!", num_output_tokens=3), 3.0)
    generate.stream_text(" late", 3.2)
    assert reply.deltas[1:] == [(0, "infobench", "Hel"), (0, "infobench", "lo"), (0, "infobench", "!")]
    assert reply.finals == []

    score.settle(RowOutcome(" B"), 4.0)
    assert reply.deltas[-1] == (2, "mmlu", "The answer is (B)")
    [outcomes] = reply.finals
    assert [o.text for o in outcomes] == [
        "Hello!",
        "submit_paths(paths=[[0, 1]], weights=[4])",
        "The answer is (B)",
    ]
    timings = [record.timing() for record in state.prompts]
    assert (timings[0].first_token_s, timings[0].output_tokens, timings[0].done_s) == (2.0, 3, 3.0)
    assert timings[1].first_token_s is None


def test_a_final_text_that_does_not_continue_the_streamed_text_adds_no_delta():
    intake = make_intake(1.0)
    reply = RecordingReply()
    request = RoutedRequest(prompts=["Instruction: hi"], tasks=["infobench"], stream=True)
    state, _ = intake.receive(request, reply)
    [record] = state.prompts
    record.stream_text("Hel", 1.5)
    record.settle(RowOutcome.failed("model instance i0 failed while running this prompt"), 2.0)
    assert reply.deltas == [(0, "infobench", "Hel")]
    [[outcome]] = reply.finals
    assert outcome.error and outcome.task == "infobench"


def test_streamed_text_is_coalesced_per_interval_and_nothing_is_held_back_at_the_end():
    intake = make_intake(0.0, stream_interval_s=0.05)
    reply = RecordingReply()
    request = RoutedRequest(prompts=["Instruction: hi"], tasks=["infobench"], stream=True)
    state, _ = intake.receive(request, reply)
    [record] = state.prompts
    record.stream_text("He", now_s=1.00)  # the first text goes at once
    record.stream_text("l", now_s=1.01)
    record.stream_text("l", now_s=1.02)
    assert reply.deltas == [(0, "infobench", "He")]
    record.stream_text("o", now_s=1.06)  # the interval has passed
    assert reply.deltas[-1] == (0, "infobench", "llo")
    record.stream_text(" w", now_s=1.07)
    state.flush(1.08)
    assert reply.deltas[-1] == (0, "infobench", " w")
    record.stream_text("or", now_s=1.09)
    record.settle(RowOutcome("Hello world", num_output_tokens=5), 1.10)
    assert "".join(text for _, _, text in reply.deltas) == "Hello world"
    assert reply.deltas[-1] == (0, "infobench", "orld")  # the waiting text and the rest, together
    assert len(reply.finals) == 1


def test_coalesced_deltas_carry_the_logprobs_of_every_piece_and_the_final_the_rest():
    intake = make_intake(1.0, stream_interval_s=1.0)
    reply = RecordingReply()
    prompt = "Instruction: hi\nQuestion: \nGeneration:"
    request = RoutedRequest(prompts=[prompt], tasks=["infobench"], stream=True)
    state, _ = intake.receive(request, reply)
    [generate] = state.prompts
    generate.stream_text("He", 1.0, '[{"id":1}]')  # the first piece goes at once
    generate.stream_text("l", 1.2, '[{"id":2}]')
    generate.stream_text("lo", 1.4, '[{"id":3},{"id":4}]')
    generate.settle(RowOutcome("Hello", num_output_tokens=5, logprobs='[{"id":5}]'), 1.5)
    assert reply.deltas == [(0, "infobench", "He"), (0, "infobench", "llo")]
    assert reply.delta_logprobs == [(0, '[{"id":1}]'), (0, '[{"id":2},{"id":3},{"id":4}]')]
    [[outcome]] = reply.finals
    assert outcome.logprobs == '[{"id":5}]', "the final response carries what no delta did"
