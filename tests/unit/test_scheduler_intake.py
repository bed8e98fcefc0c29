"""A request entering the scheduler: a record per prompt, per-prompt errors in place, one
final answer in input order once every prompt is settled."""

import asyncio

import pytest
from serving_helpers import RecordingReply, word_target

from specbatch.routing import GraphSolverPool, solve_graph
from specbatch.routing.classify import AMBIGUOUS
from specbatch.serving.messages import RowOutcome
from specbatch.serving.params import RequestError, ServingLimits
from specbatch.serving.scheduler.intake import (
    MAX_PROMPT_BYTES,
    MAX_PROMPTS_PER_REQUEST,
    RequestIntake,
    RoutedRequest,
)
from specbatch.serving.scheduler.setup import graph_solver
from specbatch.serving.scheduler.tasks import GENERATE, ROUTE, SCORE, SOLVE

GRAPH = (
    "You are given a directed graph with 3 nodes (numbered 0 to 2) and the following edges:\n"
    "Edges (source -> target, weight):\n0 -> 1, weight: 2\n1 -> 2, weight: 3\n0 -> 2, weight: 9\n"
    "Find the top 2 shortest path(s) from node 0 to node 2.\n"
    "Answer with submit_paths(paths=[[...], ...], weights=[...])."
)
MMLU = "Question:\nWhich bone is in the arm?\n\nChoices:\nA. Femur\nB. Humerus\nC. Tibia"
INFOBENCH = "Instruction: Name three colours.\nQuestion: \nGeneration:"


def make_intake(max_context: int = 64) -> RequestIntake:
    """Tokens are whitespace-separated words."""
    return RequestIntake(
        ServingLimits(max_tokens_cap=32, default_max_tokens=8), word_target(max_context), clock=lambda: 100.0
    )


def receive(intake, request):
    """The request's state, its records to run, its failures (index, outcome), the reply and
    the requests recorded settled."""
    reply, settled = RecordingReply(refuse_deltas=True), []
    state, failures = intake.receive(request, reply, settled.append)
    failed = {id(record) for record, _ in failures}
    records = [record for record in state.prompts if id(record) not in failed]
    return state, records, failures, reply, settled


def test_every_prompt_gets_a_record_and_the_request_is_answered_once_in_order():
    request = RoutedRequest(
        prompts=[GRAPH, MMLU, INFOBENCH],
        tasks=["graph", "mmlu", "infobench"],
        max_tokens=[16],
    )
    intake = make_intake()
    state, records, failures, reply, settled = receive(intake, request)

    assert failures == []
    assert [(r.index, r.prepared.kind) for r in records] == [(0, SOLVE), (1, SCORE), (2, GENERATE)]
    assert records == state.prompts and all(r.request is state for r in records)
    assert len({r.id for r in records}) == 3, "every prompt has an id of its own"
    other, _ = intake.receive(
        RoutedRequest(prompts=[INFOBENCH], tasks=["infobench"]), RecordingReply(refuse_deltas=True)
    )
    assert other.prompts[0].id not in {r.id for r in records}, "ids are unique across requests"
    assert records[1].prepared.continuations == (" A", " B", " C")
    assert records[2].sampling.max_tokens == 16 and state.arrival_s == 100.0
    assert records[2].model_text == records[2].prepared.model_prompt, "a raw prompt is not rendered"
    assert records[2].input_tokens == len(records[2].model_text.split())

    assert records[2].settle(RowOutcome("red", num_output_tokens=1), 101.0) is False
    assert records[0].settle(RowOutcome(solve_graph(records[0].prepared.source)), 101.5) is False
    assert reply.finals == [] and settled == [] and not state.done
    assert records[1].settle(RowOutcome(" B"), 102.0) is True
    assert records[1].settle(RowOutcome(" C"), 103.0) is False, "the first outcome of a prompt wins"
    assert state.done

    [outcomes] = reply.finals
    assert [o.text for o in outcomes] == [
        "submit_paths(paths=[[0, 1, 2], [0, 2]], weights=[5, 9])",
        "The answer is (B)",
        "red",
    ]
    assert [o.task for o in outcomes] == ["graph", "mmlu", "infobench"]
    [settled_state] = settled
    assert settled_state is state and settled_state.outcomes == outcomes
    assert [(t.arrival_s, t.done_s, t.output_tokens) for t in (r.timing() for r in state.prompts)] == [
        (100.0, 101.5, 0),
        (100.0, 102.0, 0),
        (100.0, 101.0, 1),
    ]


def test_the_request_is_recorded_settled_before_its_answer_goes_out():
    """Metrics move before the answer, so a client that reads them after its answer sees it."""
    order: list[str] = []

    class OrderedReply(RecordingReply):
        def final(self, outcomes) -> None:
            order.append("answer")

    request = RoutedRequest(prompts=[INFOBENCH], tasks=["infobench"], max_tokens=[4])
    state, failures = make_intake().receive(
        request, OrderedReply(refuse_deltas=True), lambda state: order.append("recorded")
    )
    [record] = state.prompts
    assert failures == []
    assert record.settle(RowOutcome("red", num_output_tokens=1), 101.0) is True
    assert order == ["recorded", "answer"]


def test_errors_stay_with_their_prompt():
    request = RoutedRequest(
        prompts=[INFOBENCH, INFOBENCH, "word " * 70, b"\xff", INFOBENCH, GRAPH.replace("0 -> 2", "x"), MMLU],
        tasks=["infobench", "", "infobench", "infobench", "infobench", "graph", "poetry"],
        route_errors=["", "prompt is empty", "", "", "", "", ""],
        max_tokens=[4, 4, 4, 4, 0, 4, 4],
    )
    _, records, failures, reply, _ = receive(make_intake(), request)
    assert [r.index for r in records] == [0, 5]
    assert [record.index for record, _ in failures] == [1, 2, 3, 4, 6]
    messages = {record.index: outcome for record, outcome in failures}
    assert all(o.finish_reason == "error" for o in messages.values())
    assert "empty" in messages[1].error
    assert "over the model context of 64 tokens" in messages[2].error
    assert "UTF-8" in messages[3].error
    assert "positive" in messages[4].error
    assert "no handler for task 'poetry'" in messages[6].error

    for record, outcome in failures:
        record.settle(outcome, 100.0)
    records[0].settle(RowOutcome("ok"), 100.0)
    records[1].settle(RowOutcome(solve_graph(records[1].prepared.source)), 100.0)
    [outcomes] = reply.finals
    assert [o.finish_reason for o in outcomes] == [
        "stop",
        "error",
        "error",
        "error",
        "error",
        "stop",
        "error",
    ]
    assert (outcomes[2].task, outcomes[6].task) == ("infobench", "poetry"), "a failed prompt keeps its task"
    assert outcomes[5].text.startswith("submit_paths(")


def test_an_oversized_prompt_fails_alone():
    request = RoutedRequest(prompts=[b"x" * (MAX_PROMPT_BYTES + 1), INFOBENCH], tasks=["infobench"] * 2)
    _, records, failures, _, _ = receive(make_intake(), request)
    [(record, outcome)] = failures
    assert record.index == 0 and f"at most {MAX_PROMPT_BYTES}" in outcome.error
    assert [r.index for r in records] == [1]


def test_an_ambiguous_prompt_becomes_a_routing_record():
    request = RoutedRequest(prompts=["A. speed\nB. cost"], tasks=[AMBIGUOUS])
    _, [record], failures, _, _ = receive(make_intake(), request)
    assert failures == [] and record.prepared.kind == ROUTE and record.task == ""
    assert record.input_tokens == 0, "its task, and so its prompt, is not known yet"


def test_a_graph_without_a_path_is_answered_with_no_paths():
    unreachable = GRAPH.replace("1 -> 2, weight: 3\n", "").replace("0 -> 2, weight: 9\n", "")
    request = RoutedRequest(prompts=[unreachable], tasks=["graph"])
    _, [record], failures, _, _ = receive(make_intake(), request)
    assert failures == [] and record.prepared.kind == SOLVE

    async def solve() -> str:
        async with GraphSolverPool(workers=1, timeout_s=30.0) as pool:
            return await graph_solver(pool)(unreachable)

    assert asyncio.run(solve()) == "submit_paths(paths=[], weights=[])"


def test_malformed_requests_raise():
    intake = make_intake()
    with pytest.raises(RequestError, match="no prompt"):
        intake.receive(RoutedRequest(prompts=[], tasks=[]), RecordingReply(refuse_deltas=True))
    with pytest.raises(RequestError, match="2 values for 3 prompts"):
        intake.receive(
            RoutedRequest(prompts=[INFOBENCH] * 3, tasks=["infobench"] * 3, max_tokens=[1, 2]),
            RecordingReply(refuse_deltas=True),
        )
    count = MAX_PROMPTS_PER_REQUEST + 1
    with pytest.raises(RequestError, match=f"at most {MAX_PROMPTS_PER_REQUEST} per request"):
        intake.receive(
            RoutedRequest(prompts=[INFOBENCH] * count, tasks=["infobench"]),
            RecordingReply(refuse_deltas=True),
        )


def test_scorer_answers_outside_the_choices_fail_the_prompt():
    _, [record], _, reply, _ = receive(make_intake(), RoutedRequest(prompts=[MMLU], tasks=["mmlu"]))
    answer = record.prepared.answer(RowOutcome(" Z"))
    assert answer.finish_reason == "error" and "not one of" in answer.error
    assert record.settle(RowOutcome(" Z"), 101.0) is True
    [[outcome]] = reply.finals
    assert outcome.finish_reason == "error" and "not one of" in outcome.error and outcome.task == "mmlu"
