"""Graph prompts: parse the edge list and answer with the top-P shortest simple paths.

The graph task is pure computation, so the server answers it here in microseconds instead
of asking an LLM. Paths come from Yen's algorithm; every spur path is the
lexicographically smallest among the shortest ones, which makes the whole result exactly
the first P simple paths in (weight, node sequence) order — a deterministic tie-break
that a brute-force enumeration reproduces.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from .errors import GraphError
from .text import normalize_newlines

Weight = int | Fraction
Path = tuple[int, ...]

MAX_PATHS = 1000

_NUMBER = r"-?\d+(?:\.\d+)?"
_EDGE_LINE = re.compile(
    r"^[ \t]*(?:[-*•][ \t]+)?(\d+)[ \t]*(<-->|<->|-->|->|→|--|—|–|-)[ \t]*(\d+)\b([^\n]*)$",
    re.MULTILINE,
)
_EDGE_WEIGHT = re.compile(
    rf"^\s*[,:;]?\s*[(\[]?\s*(?:(?:weight|cost|w)\s*[:=]?\s*)?({_NUMBER})\s*[)\]]?\s*[.,;]?\s*$",
    re.IGNORECASE,
)
_UNDIRECTED_OPS = frozenset({"<-->", "<->", "--", "—", "–", "-"})
_NODE_COUNT = re.compile(r"\b(\d+)\s+nodes\b", re.IGNORECASE)
_NODE_RANGE = re.compile(r"\bnumbered\s+(?:from\s+)?(\d+)\s+(?:to|through|-)\s+(\d+)", re.IGNORECASE)
_UNDIRECTED = re.compile(r"\bundirected\b", re.IGNORECASE)
_QUERY = re.compile(r"\bfrom\s+(?:node\s+)?(\d+)\s+to\s+(?:node\s+)?(\d+)\b", re.IGNORECASE)
_COUNT_WORDS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5,
    "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
}
_COUNT = r"(\d+|" + "|".join(_COUNT_WORDS) + r")"
_PATH_COUNT = re.compile(
    rf"\btop[\s-]*{_COUNT}\b|\b{_COUNT}\s+(?:shortest|best|cheapest|lowest[\s-]weight)\s+(?:simple\s+)?paths?\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class GraphProblem:
    """A parsed graph prompt: successor lists with the cheapest weight per edge, and the query."""

    successors: dict[int, dict[int, Weight]]
    source: int
    target: int
    num_paths: int
    directed: bool


def _parse_weight(token: str) -> Weight:
    """Integers stay ``int``; decimals become exact fractions so that ties compare exactly."""
    return Fraction(token) if "." in token else int(token)


def _format_weight(weight: Weight) -> str:
    if isinstance(weight, Fraction):
        return str(weight.numerator) if weight.denominator == 1 else repr(float(weight))
    return str(weight)


def edge_lines(text: str) -> Iterable[re.Match[str]]:
    """The lines of ``text`` shaped like ``a -> b<rest>`` (the rest holds the weight)."""
    return _EDGE_LINE.finditer(text)


def has_weight(rest: str) -> bool:
    """True when the text after ``a -> b`` is a weight such as ``, weight: 5``."""
    return _EDGE_WEIGHT.match(rest) is not None


def has_query(text: str) -> bool:
    """True when the text asks for paths "from node S to node T"."""
    return _QUERY.search(text) is not None


def _parse_count(token: str) -> int:
    return _COUNT_WORDS[token.lower()] if token.lower() in _COUNT_WORDS else int(token)


def _node_bounds(text: str) -> tuple[int, int] | None:
    numbered = _NODE_RANGE.search(text)
    if numbered:
        return int(numbered.group(1)), int(numbered.group(2))
    count = _NODE_COUNT.search(text)
    if count:
        return 0, int(count.group(1)) - 1
    return None


def _parse_query(text: str) -> tuple[int, int, int]:
    pairs = {(int(m.group(1)), int(m.group(2))): m for m in _QUERY.finditer(text)}
    if not pairs:
        raise GraphError("graph prompt names no query of the form 'from node S to node T'")
    if len(pairs) > 1:
        listed = ", ".join(f"{s} to {t}" for s, t in pairs)
        raise GraphError(f"graph prompt names several different queries ({listed}); expected one")
    (source, target), match = next(iter(pairs.items()))
    line_start = text.rfind("\n", 0, match.start()) + 1
    line_end = text.find("\n", match.end())
    query_line = text[line_start : line_end if line_end >= 0 else len(text)]
    count = _PATH_COUNT.search(query_line) or _PATH_COUNT.search(text)
    num_paths = _parse_count(count.group(1) or count.group(2)) if count else 1
    if not 1 <= num_paths <= MAX_PATHS:
        raise GraphError(f"number of paths requested must be between 1 and {MAX_PATHS}, got {num_paths}")
    return source, target, num_paths


def parse_graph(prompt: str) -> GraphProblem:
    """Parse a graph prompt (directed ``a -> b`` or undirected ``a - b`` / ``a -- b`` edges).

    Raises :class:`GraphError` with the reason when the edge list, the query or a weight
    cannot be read, or when a node lies outside the declared node range.
    """
    text = normalize_newlines(prompt)
    undirected_graph = _UNDIRECTED.search(text) is not None
    bounds = _node_bounds(text)
    successors: dict[int, dict[int, Weight]] = {}
    edge_count = 0
    for match in edge_lines(text):
        weight_match = _EDGE_WEIGHT.match(match.group(4))
        if weight_match is None:
            raise GraphError(f"cannot read the weight of edge line {match.group(0).strip()!r}")
        head, op, tail = int(match.group(1)), match.group(2), int(match.group(3))
        weight = _parse_weight(weight_match.group(1))
        if weight < 0:
            raise GraphError(f"negative edge weight in {match.group(0).strip()!r}; weights must be >= 0")
        for node in (head, tail):
            if bounds and not bounds[0] <= node <= bounds[1]:
                raise GraphError(f"node {node} lies outside the graph's nodes {bounds[0]}..{bounds[1]}")
        edge_count += 1
        arcs = [(head, tail)]
        if undirected_graph or op in _UNDIRECTED_OPS:
            arcs.append((tail, head))
        for u, v in arcs:
            if u == v:
                continue
            out = successors.setdefault(u, {})
            if v not in out or weight < out[v]:
                out[v] = weight
    if edge_count == 0:
        raise GraphError("graph prompt has no edge lines of the form 'a -> b, weight: w'")
    source, target, num_paths = _parse_query(text)
    for name, node in (("source", source), ("target", target)):
        if bounds and not bounds[0] <= node <= bounds[1]:
            raise GraphError(f"{name} node {node} lies outside the graph's nodes {bounds[0]}..{bounds[1]}")
    return GraphProblem(successors, source, target, num_paths, directed=not undirected_graph)


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

    Returns the paths that exist when there are fewer than P; raises :class:`GraphError`
    when the text cannot be parsed or no path joins the two nodes.
    """
    problem = parse_graph(prompt)
    paths = k_shortest_paths(problem.successors, problem.source, problem.target, problem.num_paths)
    if not paths:
        raise GraphError(f"no path from node {problem.source} to node {problem.target}")
    return format_submit_paths(paths)
