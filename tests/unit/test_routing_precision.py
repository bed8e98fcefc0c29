"""Routing precision on a hand-written corpus of paraphrases and look-alikes.

The corpus (tests/unit/data/routing_precision.txt) is written independently of the
workload generator. A prompt that is not a graph or mmlu task must never reach those
handlers (precision 100 %, even with a fallback that always says "graph" or "mmlu");
at least 90 % of the paraphrased graph and mmlu prompts must reach their handler; and
every one that does must be answered right: graph answers are checked against a brute
force over the ground-truth edges the author wrote down, not over what the parser read.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

from specbatch.routing import classify, parse_graph, parse_mmlu, route_evidence, solve_graph
from specbatch.routing.labelled import (
    CorpusFormatError,
    LabelledPrompt,
    handler_reads_it,
    load_corpus,
    parse_corpus,
    reference_answer,
    score,
)

CORPUS = load_corpus(Path(__file__).parent / "data" / "routing_precision.txt")
BY_TASK = {task: [case for case in CORPUS.cases if case.task == task] for task in
           ("graph", "mmlu", "infobench", "ambiguous")}
RECALL_FLOOR = 0.9


def ids(cases: list[LabelledPrompt]) -> list[str]:
    return [case.id for case in cases]


def test_corpus_has_enough_cases_of_every_kind():
    assert len(CORPUS.cases) >= 150
    assert len(BY_TASK["graph"]) >= 40
    assert len(BY_TASK["mmlu"]) >= 40
    assert len(BY_TASK["infobench"]) >= 50
    assert all(case.expect.get("graph") in CORPUS.graphs for case in BY_TASK["graph"])
    assert all(case.expect.get("labels") for case in BY_TASK["mmlu"])


@pytest.mark.parametrize("case", BY_TASK["infobench"], ids=ids(BY_TASK["infobench"]))
def test_negatives_never_reach_a_canned_handler(case: LabelledPrompt):
    evidence = route_evidence(case.prompt)
    assert evidence.decision == "infobench", evidence.reason
    for insisting in ("graph", "mmlu"):
        assert classify(case.prompt, fallback=lambda _, answer=insisting: answer) == "infobench"


@pytest.mark.parametrize("case", BY_TASK["ambiguous"], ids=ids(BY_TASK["ambiguous"]))
def test_ambiguous_prompts_go_to_the_fallback_and_default_to_infobench(case: LabelledPrompt):
    evidence = route_evidence(case.prompt)
    assert evidence.decision is None, evidence.reason
    assert "infobench" in evidence.candidates
    assert classify(case.prompt) == "infobench"


@pytest.mark.parametrize("case", BY_TASK["graph"], ids=ids(BY_TASK["graph"]))
def test_graph_prompts_that_route_to_graph_are_answered_exactly(case: LabelledPrompt):
    if classify(case.prompt) != "graph":
        pytest.skip(f"not routed to graph: {route_evidence(case.prompt).reason}")
    problem = parse_graph(case.prompt)
    expect = case.expect
    assert (problem.source, problem.target, problem.num_paths, problem.directed) == (
        expect["source"], expect["target"], expect["paths"], expect["directed"]
    )
    assert solve_graph(case.prompt) == reference_answer(CORPUS, case)


@pytest.mark.parametrize("case", BY_TASK["mmlu"], ids=ids(BY_TASK["mmlu"]))
def test_mmlu_prompts_that_route_to_mmlu_parse_their_options(case: LabelledPrompt):
    if classify(case.prompt) != "mmlu":
        pytest.skip(f"not routed to mmlu: {route_evidence(case.prompt).reason}")
    question = parse_mmlu(case.prompt)
    assert question.labels == case.expect["labels"]
    assert question.choices[-1] == case.expect["last"]
    assert question.stem


@pytest.mark.parametrize("task", ["graph", "mmlu"])
def test_at_least_ninety_percent_of_paraphrases_reach_their_handler(task: str):
    cases = BY_TASK[task]
    missed = [
        case.id for case in cases if classify(case.prompt) != task or not handler_reads_it(CORPUS, case)
    ]
    assert 1 - len(missed) / len(cases) >= RECALL_FLOOR, f"missed: {missed}"


def test_precision_is_total_on_the_whole_corpus():
    routed = [classify(case.prompt) for case in CORPUS.cases]
    for task_score in score(CORPUS.cases, routed):
        assert task_score.precision == 1.0, task_score


def test_score_counts_routed_labelled_and_correct():
    cases = [LabelledPrompt("g", "graph", "x"), LabelledPrompt("m", "mmlu", "y"),
             LabelledPrompt("n", "infobench", "z"), LabelledPrompt("a", "ambiguous", "w")]
    graph, mmlu = score(cases, ["graph", "graph", "infobench", "mmlu"])
    assert (graph.routed, graph.labelled, graph.correct) == (2, 1, 1)
    assert (graph.precision, graph.recall) == (0.5, 1.0)
    assert (mmlu.routed, mmlu.labelled, mmlu.correct) == (1, 1, 0)
    assert (mmlu.precision, mmlu.recall) == (0.0, 0.0)


def test_corpus_format_keeps_prompts_verbatim_and_applies_transforms():
    corpus = parse_corpus(
        "# header\n@graph T [[0, 1, 2]]\n=== one | graph\n"
        'expect: {"graph": "T"}\ntransform: "crlf"\n---\n  indented\t\nline two\n\n'
        "=== two | infobench\n---\nsecond\n"
    )
    assert corpus.graphs == {"T": [(0, 1, 2)]}
    assert [c.id for c in corpus.cases] == ["one", "two"]
    assert corpus.cases[0].prompt == "  indented\t\r\nline two"
    assert corpus.cases[1].prompt == "second"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("=== x | poetry\n---\nhi", "expected '=== <id>"),
        ("=== x | graph\nexpect: {nope}\n---\nhi", "not JSON"),
        ("=== x | graph\n---\n\n", "empty prompt"),
        ("=== x | graph\nhi", "unknown metadata"),
        ("=== x | graph\n---\na\n=== x | mmlu\n---\nb", "duplicate case id"),
        ("stray text", "outside a case"),
    ],
)
def test_corpus_format_errors_name_the_problem(text: str, message: str):
    with pytest.raises(CorpusFormatError, match=message):
        parse_corpus(text)


@pytest.mark.parametrize(
    "prompt",
    [
        "Question: x\nA. a\nB. b\nanswer" + " " * 50_000 + "x",
        "Find the 2 shortest paths from node 0 to node 1.\n0 -> 1, weight" + "\t" * 50_000 + "x",
        "edges" + " " * 50_000 + "x 0->1 (w=1), 1->2 (w=1)",
        "shortest paths from node 0 to node 1\n0 -> 1" + "0" * 50_000 + " -> 2",
        "which" + " (0,1,2)" * 10_000 + "?",
    ],
    ids=["answer-cue", "edge-weight", "edge-list-label", "digit-run", "tuple-run"],
)
def test_routing_time_stays_linear_on_long_runs_of_one_character(prompt: str):
    """Patterns with adjacent optional parts once backtracked for seconds on a few kilobytes of blanks."""
    start = time.perf_counter()
    classify(prompt)
    for parse in (parse_graph, parse_mmlu):
        with contextlib.suppress(ValueError):
            parse(prompt)
    assert time.perf_counter() - start < 2.0


def test_reference_answer_is_a_brute_force_over_the_ground_truth_graph():
    corpus = parse_corpus(
        "@graph T [[0, 1, 2], [1, 2, 2], [0, 2, 5], [2, 1, 1]]\n"
        '=== right | graph\nexpect: {"graph": "T", "directed": true, "source": 0, "target": 2, "paths": 2}\n'
        "---\nFind the top 2 shortest paths from node 0 to node 2.\n"
        "0 -> 1 (2)\n1 -> 2 (2)\n0 -> 2 (5)\n2 -> 1 (1)\n"
        '=== misread | graph\nexpect: {"graph": "T", "directed": false, "source": 0, "target": 2, '
        '"paths": 2}\n'
        "---\nFind the top 2 shortest paths from node 0 to node 2.\n0 -> 1 (2)\n1 -> 2 (2)\n0 -> 2 (5)\n"
    )
    right, misread = corpus.cases
    assert reference_answer(corpus, right) == "submit_paths(paths=[[0, 1, 2], [0, 2]], weights=[4, 5])"
    assert reference_answer(corpus, misread) == "submit_paths(paths=[[0, 1, 2], [0, 2]], weights=[3, 5])"
    assert handler_reads_it(corpus, right)
    assert not handler_reads_it(corpus, misread)
