"""The router stage: per-prompt routes and errors, ambiguous prompts passed on."""

from specbatch.routing.classify import AMBIGUOUS
from specbatch.serving.router.routing import PromptRouter, Route
from specbatch.serving.scheduler.tasks import parse_task

GRAPH = (
    "You are given a directed graph with 2 nodes (numbered 0 to 1) and the following edges:\n"
    "Edges (source -> target, weight):\n0 -> 1, weight: 4\n"
    "Find the top 1 shortest path(s) from node 0 to node 1.\nCall submit_paths(paths=[[...]], weights=[...])."
)
MMLU = "Question:\nWhich organ produces insulin?\n\nChoices:\nA. Liver\nB. Pancreas\nC. Kidney"
# Lettered options with nothing asking to choose or to do anything else ("Rank these" asks to rank).
UNPLACED = "Here are my options:\nA. speed\nB. cost"


def test_routes_each_prompt_and_keeps_errors_in_place():
    routes = PromptRouter().route([GRAPH, MMLU, b"", b"\xff", "Write a poem about rain."], None)
    assert [r.task for r in routes] == ["graph", "mmlu", "", "", "infobench"]
    assert [bool(r.error) for r in routes] == [False, False, True, True, False]


def test_overrides_win_and_unknown_overrides_fail_alone():
    routes = PromptRouter().route([MMLU, MMLU, MMLU], [b"infobench", b"", b"poetry"])
    assert [r.task for r in routes] == ["infobench", "mmlu", ""]
    assert "unknown task override" in routes[2].error


def test_a_prompt_structure_cannot_place_is_passed_on_as_ambiguous():
    routes = PromptRouter().route([UNPLACED, GRAPH])
    assert routes == [Route(AMBIGUOUS), Route("graph")]
    assert routes[0].error == ""
    assert PromptRouter().route([UNPLACED], [b"mmlu"])[0].task == "mmlu", "an override places it"


def test_parse_task_reads_the_first_task_word():
    assert parse_task("Graph.") == "graph"
    assert parse_task("it is infobench or mmlu") == "infobench"
    assert parse_task("no idea") is None
    assert parse_task("mmlus") is None, "whole words only"
