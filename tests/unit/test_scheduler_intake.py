"""Admission of a request: a job per servable prompt, per-prompt errors in place, one final
answer in input order once every prompt is settled."""

import asyncio

import pytest

from specbatch.routing import GraphSolverPool, solve_graph
from specbatch.serving.params import PromptError, RequestError, ServingLimits
from specbatch.serving.scheduler.intake import (
    MAX_PROMPT_BYTES,
    MAX_PROMPTS_PER_REQUEST,
    RequestIntake,
    RoutedRequest,
)
from specbatch.serving.scheduler.setup import graph_solver
from specbatch.serving.scheduler.tasks import GENERATE, ROUTE, SCORE, SOLVE
from specbatch.serving.wire import AMBIGUOUS, RowOutcome

GRAPH = (
    "You are given a directed graph with 3 nodes (numbered 0 to 2) and the following edges:\n"
    "Edges (source -> target, weight):\n0 -> 1, weight: 2\n1 -> 2, weight: 3\n0 -> 2, weight: 9\n"
    "Find the top 2 shortest path(s) from node 0 to node 2.\n"
    "Answer with submit_paths(paths=[[...], ...], weights=[...])."
)
MMLU = "Question:\nWhich bone is in the arm?\n\nChoices:\nA. Femur\nB. Humerus\nC. Tibia"
INFOBENCH = "Instruction: Name three colours.\nQuestion: \nGeneration:"


class Reply:
    def __init__(self) -> None:
        self.finals: list[list[RowOutcome]] = []

    def delta(self, index, task, text) -> None:
        raise AssertionError("nothing streams in a request that did not ask to")

    def final(self, outcomes) -> None:
        self.finals.append(outcomes)

    def is_cancelled(self) -> bool:
        return False


def make_intake(max_context: int = 64) -> RequestIntake:
    return RequestIntake(
        ServingLimits(max_tokens_cap=32, default_max_tokens=8),
        lambda t: len(t.split()),
        max_context,
        clock=lambda: 100.0,
    )


def admit(intake, request):
    reply, settled = Reply(), []
    state, jobs, errors = intake.admit(request, reply, lambda *args: settled.append(args))
    return state, jobs, errors, reply, settled


def test_every_prompt_becomes_a_job_and_the_request_is_answered_once_in_order():
    request = RoutedRequest(
        prompts=[GRAPH, MMLU, INFOBENCH],
        tasks=["graph", "mmlu", "infobench"],
        predicted_tokens=[1, 1, 40],
        max_tokens=[16],
    )
    state, jobs, errors, reply, settled = admit(make_intake(), request)

    assert errors == []
    assert [(j.index, j.prepared.kind) for j in jobs] == [(0, SOLVE), (1, SCORE), (2, GENERATE)]
    assert all(j.state is state and j.key == (state.serial, j.index) for j in jobs)
    assert jobs[1].prepared.continuations == (" A", " B", " C")
    assert jobs[2].sampling.max_tokens == 16 and state.arrival_s == 100.0
    assert jobs[2].predicted_tokens == 16, "max_tokens caps the router's prediction"

    assert jobs[2].settle(RowOutcome("red", num_output_tokens=1), 101.0) is False
    assert jobs[0].settle(RowOutcome(solve_graph(jobs[0].prepared.source)), 101.5) is False
    assert reply.finals == [] and settled == []
    assert jobs[1].settle(RowOutcome(" B"), 102.0) is True
    assert jobs[1].settle(RowOutcome(" C"), 103.0) is False, "the first outcome of a prompt wins"

    [outcomes] = reply.finals
    assert [o.text for o in outcomes] == [
        "submit_paths(paths=[[0, 1, 2], [0, 2]], weights=[5, 9])",
        "The answer is (B)",
        "red",
    ]
    assert [o.task for o in outcomes] == ["graph", "mmlu", "infobench"]
    [(settled_state, settled_outcomes, timings)] = settled
    assert settled_state is state and settled_outcomes == outcomes
    assert [(t.arrival_s, t.done_s, t.output_tokens) for t in timings] == [
        (100.0, 101.5, 0),
        (100.0, 102.0, 0),
        (100.0, 101.0, 1),
    ]


def test_the_request_is_recorded_settled_before_its_answer_goes_out():
    """Metrics move before the answer, so a client that reads them after its answer sees it."""
    order: list[str] = []

    class OrderedReply(Reply):
        def final(self, outcomes) -> None:
            order.append("answer")

    request = RoutedRequest(prompts=[INFOBENCH], tasks=["infobench"], predicted_tokens=[4], max_tokens=[4])
    _, [job], _ = make_intake().admit(request, OrderedReply(), lambda *args: order.append("recorded"))
    assert job.settle(RowOutcome("red", num_output_tokens=1), 101.0) is True
    assert order == ["recorded", "answer"]


def test_errors_stay_with_their_prompt():
    request = RoutedRequest(
        prompts=[INFOBENCH, INFOBENCH, "word " * 70, b"\xff", INFOBENCH, GRAPH.replace("0 -> 2", "x"), MMLU],
        tasks=["infobench", "", "infobench", "infobench", "infobench", "graph", "poetry"],
        predicted_tokens=[5] * 7,
        route_errors=["", "prompt is empty", "", "", "", "", ""],
        max_tokens=[4, 4, 4, 4, 0, 4, 4],
    )
    state, jobs, errors, reply, _ = admit(make_intake(), request)
    assert [j.index for j in jobs] == [0, 5]
    assert [index for index, _ in errors] == [1, 2, 3, 4, 6]
    messages = dict(errors)
    assert all(o.finish_reason == "error" for o in messages.values())
    assert "empty" in messages[1].error
    assert "over the model context of 64 tokens" in messages[2].error
    assert "UTF-8" in messages[3].error
    assert "positive" in messages[4].error
    assert "no handler for task 'poetry'" in messages[6].error
    assert (messages[2].task, messages[6].task) == ("infobench", "poetry")

    for index, outcome in errors:
        state.settle(index, outcome, 100.0)
    jobs[0].settle(RowOutcome("ok"), 100.0)
    jobs[1].settle(RowOutcome(solve_graph(jobs[1].prepared.source)), 100.0)
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
    assert outcomes[5].text.startswith("submit_paths(")


def test_an_oversized_prompt_fails_alone():
    request = RoutedRequest(
        prompts=[b"x" * (MAX_PROMPT_BYTES + 1), INFOBENCH], tasks=["infobench"] * 2, predicted_tokens=[4]
    )
    _, jobs, errors, _, _ = admit(make_intake(), request)
    [(index, outcome)] = errors
    assert index == 0 and f"at most {MAX_PROMPT_BYTES}" in outcome.error
    assert [j.index for j in jobs] == [1]


def test_an_ambiguous_prompt_becomes_a_routing_job():
    request = RoutedRequest(prompts=["A. speed\nB. cost"], tasks=[AMBIGUOUS], predicted_tokens=[8])
    _, [job], errors, _, _ = admit(make_intake(), request)
    assert errors == [] and job.prepared.kind == ROUTE and job.task == ""
    assert job.input_tokens == 0, "its task, and so its prompt, is not known yet"


def test_a_graph_without_a_path_fails_with_a_clear_message():
    unreachable = GRAPH.replace("1 -> 2, weight: 3\n", "").replace("0 -> 2, weight: 9\n", "")
    _, [job], errors, _, _ = admit(
        make_intake(), RoutedRequest(prompts=[unreachable], tasks=["graph"], predicted_tokens=[1])
    )
    assert errors == [] and job.prepared.kind == SOLVE

    async def solve() -> str:
        async with GraphSolverPool(workers=1, timeout_s=30.0) as pool:
            return await graph_solver(pool)(unreachable)

    with pytest.raises(PromptError, match="graph prompt: no path from node 0 to node 2"):
        asyncio.run(solve())


def test_malformed_requests_raise():
    intake = make_intake()
    with pytest.raises(RequestError, match="no prompt"):
        intake.admit(RoutedRequest(prompts=[], tasks=[], predicted_tokens=[]), Reply())
    with pytest.raises(RequestError, match="2 values for 3 prompts"):
        intake.admit(
            RoutedRequest(
                prompts=[INFOBENCH] * 3, tasks=["infobench"] * 3, predicted_tokens=[1] * 3, max_tokens=[1, 2]
            ),
            Reply(),
        )
    count = MAX_PROMPTS_PER_REQUEST + 1
    with pytest.raises(RequestError, match=f"at most {MAX_PROMPTS_PER_REQUEST} per request"):
        intake.admit(
            RoutedRequest(prompts=[INFOBENCH] * count, tasks=["infobench"], predicted_tokens=[1]), Reply()
        )


def test_scorer_answers_outside_the_choices_fail_the_prompt():
    _, [job], _, _, _ = admit(
        make_intake(), RoutedRequest(prompts=[MMLU], tasks=["mmlu"], predicted_tokens=[1])
    )
    outcome = job.prepared.finish(RowOutcome(" Z"))
    assert outcome.finish_reason == "error" and "not one of" in outcome.error and outcome.task == "mmlu"
