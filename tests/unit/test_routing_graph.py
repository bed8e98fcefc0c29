"""Graph prompts: parsing both edge styles, exact Yen answers, errors, and brute-force agreement."""

from __future__ import annotations

import itertools
import random

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specbatch.routing import GraphError, classify, k_shortest_paths, parse_graph, solve_graph
from specbatch.routing.errors import GraphLimitError
from specbatch.routing.graph import format_submit_paths
from specbatch.routing.graph_parse import MAX_EDGES, MAX_NODES, MAX_PATH_WORK, MAX_PATHS

FOOTER = (
    "Return your answer by calling the submit_paths function with:\n"
    "- paths: A list of paths, where each path is a list of node indices\n"
    "- weights: A list of corresponding path weights\n\n"
    "For example, if the shortest path is [0, 2, 4] with weight 10, call:\n"
    "submit_paths(paths=[[0, 2, 4]], weights=[10])\n"
)
EDGES = """0 -> 1, weight: 2
0 -> 2, weight: 5
1 -> 2, weight: 1
1 -> 3, weight: 6
2 -> 3, weight: 2
2 -> 4, weight: 7
3 -> 4, weight: 1"""


def directed_prompt(
    edges: str = EDGES, num_paths: int = 3, source: int = 0, target: int = 4, nodes: int = 5
) -> str:
    plural = "s" if num_paths > 1 else ""
    return (
        f"You are given a directed graph with {nodes} nodes (numbered 0 to {nodes - 1}) and the following "
        "edges:\n\n"
        f"Edges (source -> target, weight):\n{edges}\n\n"
        f"Find the top {num_paths} shortest path{plural} from node {source} to node {target}.\n\n{FOOTER}"
    )


def brute_force(successors: dict[int, dict[int, int]], source: int, target: int, k: int):
    found = []

    def walk(path: list[int], weight: int) -> None:
        if path[-1] == target:
            found.append((weight, tuple(path)))
            return
        for v, w in successors.get(path[-1], {}).items():
            if v not in path:
                walk([*path, v], weight + w)

    walk([source], 0)
    return [(path, weight) for weight, path in sorted(found)[:k]]


def test_design_prompt_gets_exact_top_three():
    assert solve_graph(directed_prompt()) == (
        "submit_paths(paths=[[0, 1, 2, 3, 4], [0, 2, 3, 4], [0, 1, 3, 4]], weights=[6, 8, 9])"
    )


def test_single_path_wording():
    assert solve_graph(directed_prompt(num_paths=1)) == "submit_paths(paths=[[0, 1, 2, 3, 4]], weights=[6])"


def test_fewer_paths_than_requested_returns_those_that_exist():
    answer = solve_graph(directed_prompt(num_paths=10))
    assert answer == (
        "submit_paths(paths=[[0, 1, 2, 3, 4], [0, 2, 3, 4], [0, 1, 3, 4], [0, 1, 2, 4], [0, 2, 4]], "
        "weights=[6, 8, 9, 10, 12])"
    )


def test_equal_weights_break_ties_by_path_order():
    edges = "0 -> 2, weight: 1\n0 -> 1, weight: 1\n2 -> 3, weight: 1\n1 -> 3, weight: 1"
    assert solve_graph(directed_prompt(edges, 2, 0, 3, 4)) == (
        "submit_paths(paths=[[0, 1, 3], [0, 2, 3]], weights=[2, 2])"
    )


def test_undirected_graph_with_dash_edges():
    prompt = (
        "You are given an undirected graph with 4 nodes (numbered 0 to 3) and the following edges:\n\n"
        "0 - 1, weight: 1\n1 -- 2, weight: 1\n2 - 3, weight: 1\n0 - 3, weight: 5\n\n"
        "Find the top 2 shortest paths from node 3 to node 0.\n\n" + FOOTER
    )
    problem = parse_graph(prompt)
    assert not problem.directed
    assert solve_graph(prompt) == "submit_paths(paths=[[3, 2, 1, 0], [3, 0]], weights=[3, 5])"


def test_directed_edges_are_one_way():
    edges = "0 -> 1, weight: 1\n2 -> 1, weight: 1"
    assert solve_graph(directed_prompt(edges, 1, 0, 2, 3)) == "submit_paths(paths=[], weights=[])"


def test_crlf_upper_case_and_indentation_parse_the_same():
    prompt = directed_prompt().upper().replace("\n", "\r\n").replace("\r\n0 ->", "\r\n\t0 ->")
    assert solve_graph(prompt) == solve_graph(directed_prompt())


def test_decimal_weights_are_exact():
    edges = "0 -> 1, weight: 0.1\n1 -> 2, weight: 0.2\n0 -> 2, weight: 0.3"
    assert solve_graph(directed_prompt(edges, 2, 0, 2, 3)) == (
        "submit_paths(paths=[[0, 1, 2], [0, 2]], weights=[0.3, 0.3])"
    )


def test_duplicate_edge_keeps_the_cheaper_weight():
    edges = "0 -> 1, weight: 9\n0 -> 1, weight: 4\n1 -> 2, weight: 1"
    assert solve_graph(directed_prompt(edges, 1, 0, 2, 3)) == "submit_paths(paths=[[0, 1, 2]], weights=[5])"


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("Find the top 2 shortest paths from node 0 to node 3.", "no edge lines"),
        (directed_prompt("0 -> 1, weight: heavy\n1 -> 4, weight: 2"), "cannot read the weight"),
        (directed_prompt("0 -> 1, weight: 3\n1 -> 7, weight: 2"), "node 7 lies outside"),
        (directed_prompt("0 -> 1, weight: -3\n1 -> 4, weight: 2"), "negative edge weight"),
        (directed_prompt(num_paths=0), "between 1 and"),
        (directed_prompt(target=9), "target node 9 lies outside"),
        (directed_prompt().replace("from node 0 to node 4", "between the two ends"), "from node S to node T"),
    ],
)
def test_malformed_prompts_raise_clear_errors(prompt: str, message: str):
    with pytest.raises(GraphError, match=message):
        solve_graph(prompt)


def test_graph_error_is_a_value_error():
    assert issubclass(GraphError, ValueError)


@st.composite
def random_graphs(draw):
    n = draw(st.integers(2, 8))
    arc = st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), st.integers(0, 6))
    arcs = draw(st.lists(arc, max_size=30))
    successors: dict[int, dict[int, int]] = {}
    for u, v, w in arcs:
        if u != v:
            successors.setdefault(u, {})[v] = w
    source, target = draw(st.sampled_from(list(itertools.permutations(range(n), 2))))
    return successors, source, target, draw(st.integers(1, 5))


@settings(max_examples=600, deadline=None, derandomize=True)
@given(random_graphs())
def test_yen_matches_brute_force_enumeration(case):
    successors, source, target, k = case
    assert k_shortest_paths(successors, source, target, k) == brute_force(successors, source, target, k)


@pytest.mark.parametrize("seed", range(40))
def test_solve_graph_text_matches_brute_force(seed: int):
    rng = random.Random(seed)
    n = rng.randint(3, 8)
    arcs = {(u, v): rng.randint(1, 9) for u in range(n) for v in range(n) if u != v and rng.random() < 0.45}
    arcs[(0, n - 1)] = arcs.get((0, n - 1), 20)
    k = rng.randint(1, 5)
    edges = "\n".join(f"{u} -> {v}, weight: {w}" for (u, v), w in sorted(arcs.items()))
    successors: dict[int, dict[int, int]] = {}
    for (u, v), w in arcs.items():
        successors.setdefault(u, {})[v] = w
    expected = format_submit_paths(brute_force(successors, 0, n - 1, k))
    assert solve_graph(directed_prompt(edges, k, 0, n - 1, n)) == expected


@pytest.mark.parametrize("seed", range(10))
def test_weights_agree_with_networkx_on_dense_twenty_node_graphs(seed: int):
    rng = random.Random(seed)
    successors = {u: {v: rng.randint(1, 100) for v in range(20) if v != u} for u in range(20)}
    ours = k_shortest_paths(successors, 0, 19, 5)
    reference = nx.DiGraph()
    reference.add_weighted_edges_from((u, v, w) for u, out in successors.items() for v, w in out.items())
    nx_paths = list(itertools.islice(nx.shortest_simple_paths(reference, 0, 19, weight="weight"), 5))
    nx_weights = [nx.path_weight(reference, path, "weight") for path in nx_paths]
    assert [weight for _, weight in ours] == nx_weights
    for path, weight in ours:
        assert nx.path_weight(reference, list(path), "weight") == weight
        assert len(set(path)) == len(path)


def dense_prompt(nodes: int, num_paths: int, extra: str = "") -> str:
    pairs = ((u, v) for u in range(nodes) for v in range(nodes) if u != v)
    edges = "\n".join(f"{u} -> {v}, weight: {1 + (u * v) % 7}" for u, v in pairs)
    return directed_prompt(edges, num_paths, 0, nodes - 1, nodes) + extra


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        (directed_prompt(num_paths=MAX_PATHS + 1), f"between 1 and {MAX_PATHS}"),
        (dense_prompt(102, 1), f"at most {MAX_EDGES} are accepted"),
        (dense_prompt(80, 100), f"within {MAX_PATH_WORK}"),
        (directed_prompt("0 -> 1, weight: 1\n1 -> 4, weight: 1", nodes=MAX_NODES + 1),
         f"at most {MAX_NODES}"),
    ],
    ids=["paths", "edges", "paths-times-edges", "nodes"],
)
def test_graphs_over_the_limits_are_refused_with_the_limit_named(prompt: str, message: str):
    with pytest.raises(GraphLimitError, match=message):
        solve_graph(prompt)
    assert classify(prompt) == "graph"


def test_an_oversized_graph_with_another_ask_is_not_routed_to_graph():
    assert classify(dense_prompt(102, 1, "\nExplain each step of the search.")) == "infobench"


EDGES_C = "0 -> 1, weight: 3\n0 -> 2, weight: 3\n1 -> 3, weight: 2\n2 -> 3, weight: 2\n3 -> 4, weight: 1"


@pytest.mark.parametrize("arrow", ["⇒", "⟹"])
def test_a_query_written_as_a_double_arrow_names_source_and_target(arrow: str):
    problem = parse_graph(f"Shortest paths, top 2, 0 {arrow} 4.\n{EDGES_C}")
    assert (problem.source, problem.target, problem.num_paths) == (0, 4, 2)


def test_a_chain_of_double_arrows_in_the_question_is_a_path_not_a_query():
    with pytest.raises(GraphError, match="names no query"):
        parse_graph(f"Shortest paths, top 2, 0 ⇒ 2 ⇒ 4.\n{EDGES_C}")
    assert classify(f"Is 0 ⇒ 2 ⇒ 4 among the 2 shortest paths?\n{EDGES_C}") == "infobench"
