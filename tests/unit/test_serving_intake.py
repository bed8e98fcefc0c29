"""Admission: graph answered at once, per-prompt errors in place, jobs for the models."""

import pytest

from specbatch.serving.intake import RequestIntake, RoutedRequest
from specbatch.serving.outcomes import PromptOutcome
from specbatch.serving.params import PromptError, ServingLimits
from specbatch.serving.tasks import GENERATE, SCORE

GRAPH = (
    "You are given a directed graph with 3 nodes (numbered 0 to 2) and the following edges:\n"
    "Edges (source -> target, weight):\n0 -> 1, weight: 2\n1 -> 2, weight: 3\n0 -> 2, weight: 9\n"
    "Find the top 2 shortest path(s) from node 0 to node 2.\n"
    "Answer with submit_paths(paths=[[...], ...], weights=[...])."
)
MMLU = "Question:\nWhich bone is in the arm?\n\nChoices:\nA. Femur\nB. Humerus\nC. Tibia"
INFOBENCH = "Instruction: Name three colours.\nQuestion: \nGeneration:"


def make_intake(max_context: int = 64) -> RequestIntake:
    return RequestIntake(
        ServingLimits(max_tokens_cap=32, default_max_tokens=8),
        lambda t: len(t.split()),
        max_context,
        clock=lambda: 100.0,
    )


def admit(intake, request):
    delivered: list[list[PromptOutcome]] = []
    jobs = intake.admit(request, lambda outcomes, timings: delivered.append(outcomes))
    return jobs, delivered


def test_graph_is_answered_at_once_and_model_prompts_become_jobs():
    request = RoutedRequest(
        prompts=[GRAPH, MMLU, INFOBENCH],
        tasks=["graph", "mmlu", "infobench"],
        predicted_tokens=[1, 1, 40],
        max_tokens=[16],
    )
    jobs, delivered = admit(make_intake(), request)

    assert delivered == []
    assert [(j.key[1], j.prepared.kind) for j in jobs] == [(1, SCORE), (2, GENERATE)]
    assert jobs[0].prepared.continuations == (" A", " B", " C")
    assert jobs[1].sampling.max_tokens == 16 and jobs[1].arrival_s == 100.0
    assert jobs[1].predicted_tokens == 16, "max_tokens caps the router's prediction"

    jobs[1].on_done(PromptOutcome("red", task="infobench", num_output_tokens=1))
    assert delivered == []
    jobs[0].on_done(jobs[0].prepared.finish(PromptOutcome(" B")))
    [outcomes] = delivered
    assert [o.text for o in outcomes] == [
        "submit_paths(paths=[[0, 1, 2], [0, 2]], weights=[5, 9])",
        "The answer is (B)",
        "red",
    ]
    assert [o.task for o in outcomes] == ["graph", "mmlu", "infobench"]


def test_errors_stay_with_their_prompt():
    request = RoutedRequest(
        prompts=[INFOBENCH, INFOBENCH, "word " * 70, b"\xff", INFOBENCH, GRAPH.replace("0 -> 2", "x")],
        tasks=["infobench", "", "infobench", "infobench", "infobench", "graph"],
        predicted_tokens=[5] * 6,
        route_errors=["", "prompt is empty", "", "", "", ""],
        max_tokens=[4, 4, 4, 4, 0, 4],
    )
    jobs, delivered = admit(make_intake(), request)
    assert [j.key[1] for j in jobs] == [0]
    jobs[0].on_done(PromptOutcome("ok", task="infobench"))
    [outcomes] = delivered
    assert [o.finish_reason for o in outcomes] == ["stop", "error", "error", "error", "error", "stop"]
    assert "empty" in outcomes[1].error
    assert "over the model context of 64 tokens" in outcomes[2].error
    assert "UTF-8" in outcomes[3].error
    assert "positive" in outcomes[4].error
    assert outcomes[5].text.startswith("submit_paths(")


def test_a_graph_without_a_path_fails_with_a_clear_message():
    unreachable = GRAPH.replace("1 -> 2, weight: 3\n", "").replace("0 -> 2, weight: 9\n", "")
    _, delivered = admit(
        make_intake(), RoutedRequest(prompts=[unreachable], tasks=["graph"], predicted_tokens=[1])
    )
    [[outcome]] = delivered
    assert outcome.finish_reason == "error" and "graph" in outcome.error


def test_malformed_requests_raise():
    with pytest.raises(PromptError):
        make_intake().admit(RoutedRequest(prompts=[], tasks=[], predicted_tokens=[]), lambda *_: None)
    with pytest.raises(ValueError, match="2 values for 3 prompts"):
        make_intake().admit(
            RoutedRequest(
                prompts=[INFOBENCH] * 3, tasks=["infobench"] * 3, predicted_tokens=[1] * 3, max_tokens=[1, 2]
            ),
            lambda outcomes, timings: None,
        )


def test_scorer_answers_outside_the_choices_fail_the_prompt():
    jobs, _ = admit(make_intake(), RoutedRequest(prompts=[MMLU], tasks=["mmlu"], predicted_tokens=[1]))
    outcome = jobs[0].prepared.finish(PromptOutcome(" Z"))
    assert outcome.finish_reason == "error" and "not one of" in outcome.error
