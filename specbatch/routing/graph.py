"""Graph prompts: answer with the top-P shortest simple paths.

Parsing lives in :mod:`.graph_parse` (the question) and :mod:`.edges` (the edge list).
The graph task is pure computation, so the server answers it here in microseconds instead
of asking an LLM. Paths come from Yen's algorithm; every spur path is the
lexicographically smallest among the shortest ones, which makes the whole result exactly
the first P simple paths in (weight, node sequence) order — a deterministic tie-break
that a brute-force enumeration reproduces.
"""

from __future__ import annotations

import heapq
from fractions import Fraction

from .edges import Weight
from .errors import GraphError
from .graph_parse import parse_graph

Path = tuple[int, ...]


def _format_weight(weight: Weight) -> str:
    if isinstance(weight, Fraction):
        return str(weight.numerator) if weight.denominator == 1 else repr(float(weight))
    return str(weight)


def _reverse(successors: dict[int, dict[int, Weight]]) -> dict[int, list[tuple[int, Weight]]]:
    predecessors: dict[int, list[tuple[int, Weight]]] = {}
    for u, out in successors.items():
        for v, w in out.items():
            predecessors.setdefault(v, []).append((u, w))
    return predecessors


class _Searcher:
    """Shortest spur paths on one graph, with nodes and first edges removed per call."""

    def __init__(self, successors: dict[int, dict[int, Weight]], target: int) -> None:
        self.successors = {u: sorted(out.items()) for u, out in successors.items()}
        self.predecessors = _reverse(successors)
        self.target = target

    def _distances_to_target(
        self, start: int, banned_nodes: frozenset[int], banned_first: frozenset[int]
    ) -> dict[int, Weight]:
        """Exact distances to the target for every node at most as far as ``start``."""
        settled: dict[int, Weight] = {}
        heap: list[tuple[Weight, int]] = [(0, self.target)]
        tentative: dict[int, Weight] = {self.target: 0}
        while heap:
            dist, v = heapq.heappop(heap)
            if v in settled:
                continue
            if start in settled and dist > settled[start]:
                break
            settled[v] = dist
            for u, w in self.predecessors.get(v, ()):
                if u in settled or u in banned_nodes or (u == start and v in banned_first):
                    continue
                candidate = dist + w
                if candidate < tentative.get(u, candidate + 1):
                    tentative[u] = candidate
                    heapq.heappush(heap, (candidate, u))
        return settled

    def best_path(
        self, start: int, banned_nodes: frozenset[int], banned_first: frozenset[int]
    ) -> tuple[Weight, Path] | None:
        """The lexicographically smallest of the shortest simple paths from ``start`` to the target.

        Follows only tight edges (``w(u, v) + d(v) == d(u)``) in ascending node order and
        backtracks on dead ends, which can only occur through zero-weight cycles.
        """
        if start in banned_nodes:
            return None
        dist = self._distances_to_target(start, banned_nodes, banned_first)
        if start not in dist:
            return None
        path = [start]
        on_path = {start}
        choices = [iter(self.successors.get(start, ()))]
        while choices:
            u = path[-1]
            if u == self.target:
                return dist[start], tuple(path)
            advanced = False
            for v, w in choices[-1]:
                if v in on_path or v not in dist or w + dist[v] != dist[u]:
                    continue
                if u == start and v in banned_first:
                    continue
                path.append(v)
                on_path.add(v)
                choices.append(iter(self.successors.get(v, ())))
                advanced = True
                break
            if not advanced:
                on_path.discard(path.pop())
                choices.pop()
        return None


def k_shortest_paths(
    successors: dict[int, dict[int, Weight]], source: int, target: int, k: int
) -> list[tuple[Path, Weight]]:
    """Yen's algorithm: the first ``k`` simple paths in (weight, node sequence) order.

    Returns fewer than ``k`` when fewer simple paths exist, and an empty list when the
    target is unreachable. Weights must be non-negative.
    """
    if k < 1:
        raise GraphError(f"number of paths must be at least 1, got {k}")
    searcher = _Searcher(successors, target)
    first = searcher.best_path(source, frozenset(), frozenset())
    if first is None:
        return []
    accepted: list[tuple[Weight, Path]] = [first]
    candidates: list[tuple[Weight, Path]] = []
    queued: set[Path] = {first[1]}
    while len(accepted) < k:
        _, previous = accepted[-1]
        root_weight: Weight = 0
        for i, spur in enumerate(previous[:-1]):
            root = previous[: i + 1]
            banned_first = frozenset(p[i + 1] for _, p in accepted if len(p) > i + 1 and p[: i + 1] == root)
            spur_result = searcher.best_path(spur, frozenset(root[:-1]), banned_first)
            if spur_result is not None:
                spur_weight, spur_path = spur_result
                path = root[:-1] + spur_path
                if path not in queued:
                    queued.add(path)
                    heapq.heappush(candidates, (root_weight + spur_weight, path))
            root_weight += successors[spur][previous[i + 1]]
        if not candidates:
            break
        accepted.append(heapq.heappop(candidates))
    return [(path, weight) for weight, path in accepted]


def format_submit_paths(paths: list[tuple[Path, Weight]]) -> str:
    """Render paths exactly as the prompt asks: ``submit_paths(paths=[[0, 2]], weights=[3])``."""
    rendered_paths = ", ".join("[" + ", ".join(map(str, path)) + "]" for path, _ in paths)
    rendered_weights = ", ".join(_format_weight(weight) for _, weight in paths)
    return f"submit_paths(paths=[{rendered_paths}], weights=[{rendered_weights}])"


def solve_graph(prompt: str) -> str:
    """Answer a graph prompt with its top-P shortest simple paths as a ``submit_paths`` call.

    Returns the paths that exist when there are fewer than P, and so none at all,
    ``submit_paths(paths=[], weights=[])``, when no path joins the two nodes: the question
    is well posed and that is its answer, in the form the prompt asks for. Raises
    :class:`GraphError` when the text cannot be parsed.
    """
    problem = parse_graph(prompt)
    return format_submit_paths(
        k_shortest_paths(problem.successors, problem.source, problem.target, problem.num_paths)
    )
