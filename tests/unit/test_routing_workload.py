"""The generated workload: reproducible, shaped by the mix, and with correct graph answers."""

from __future__ import annotations

import ast
import collections
import itertools
import re

import networkx as nx
import pytest

from specbatch.routing import generate_workload, parse_graph, parse_mmlu, solve_graph


def test_same_seed_same_prompts_other_seed_other_prompts():
    assert generate_workload(200, seed=3) == generate_workload(200, seed=3)
    assert generate_workload(200, seed=3) != generate_workload(200, seed=4)


def test_mix_controls_task_shares():
    workload = generate_workload(2000, seed=1, mix={"graph": 0.1, "mmlu": 0.2, "infobench": 0.7})
    counts = collections.Counter(prompt.task for prompt in workload)
    assert counts["graph"] == pytest.approx(200, abs=60)
    assert counts["mmlu"] == pytest.approx(400, abs=80)
    assert counts["infobench"] == pytest.approx(1400, abs=100)
    assert {p.task for p in generate_workload(50, seed=1, mix={"mmlu": 1.0})} == {"mmlu"}


def test_both_renderings_and_perturbations_appear():
    workload = generate_workload(1000, seed=2)
    renderings = collections.Counter((p.task, p.rendering) for p in workload)
    for task in ("mmlu", "infobench"):
        assert renderings[(task, "request")] > 100
        assert renderings[(task, "dataset")] > 100
    assert any("\r\n" in p.text for p in workload)
    assert any(p.text.isupper() for p in workload)
    assert any(re.search(r"^E\. ", p.text, re.MULTILINE) for p in workload if p.task == "mmlu")


@pytest.mark.parametrize("mix", [{"poetry": 1.0}, {"graph": -1.0, "mmlu": 2.0}, {"graph": 0.0}])
def test_bad_mix_raises(mix):
    with pytest.raises(ValueError, match="mix"):
        generate_workload(10, seed=0, mix=mix)


def test_mmlu_expected_labels_match_the_text():
    for prompt in generate_workload(300, seed=7, mix={"mmlu": 1.0}):
        assert parse_mmlu(prompt.text).labels == prompt.expected


def _answer(expected: str) -> tuple[list[list[int]], list[int]]:
    match = re.fullmatch(r"submit_paths\(paths=(.*), weights=(.*)\)", expected)
    assert match
    return ast.literal_eval(match.group(1)), ast.literal_eval(match.group(2))


def test_graph_answers_agree_with_networkx():
    for prompt in generate_workload(120, seed=9, mix={"graph": 1.0}):
        problem = parse_graph(prompt.text)
        reference = nx.DiGraph()
        reference.add_weighted_edges_from(
            (u, v, w) for u, out in problem.successors.items() for v, w in out.items()
        )
        paths, weights = _answer(prompt.expected)
        simple = nx.shortest_simple_paths(reference, problem.source, problem.target, weight="weight")
        best_paths = itertools.islice(simple, problem.num_paths)
        best = [nx.path_weight(reference, path, "weight") for path in best_paths]
        assert weights == best
        for path, weight in zip(paths, weights, strict=True):
            assert (path[0], path[-1]) == (problem.source, problem.target)
            assert len(set(path)) == len(path)
            assert nx.path_weight(reference, path, "weight") == weight
        ranked = list(zip(weights, paths, strict=True))
        assert sorted(ranked) == ranked


def test_perturbed_graph_prompts_solve_to_their_expected_answer():
    workload = generate_workload(300, seed=13, mix={"graph": 1.0})
    assert sum("\r\n" in p.text or p.text.isupper() or p.text.islower() for p in workload) > 30
    for prompt in workload:
        assert solve_graph(prompt.text) == prompt.expected
