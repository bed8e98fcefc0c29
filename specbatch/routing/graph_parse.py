"""Read a graph prompt into a :class:`GraphProblem`: edges, source, target, P, direction.

The edges come from :mod:`.edges`; this module reads the question around them — "from
node 0 to node 7", "source: 0, target: 7", "between 0 and 7" (undirected graphs only,
where the direction cannot matter), "the top 3", "three shortest paths", "k = 3" — and
enforces the size limits that keep one prompt from holding a worker for seconds.

It also reports how certain the reading is: a count of paths that the prompt states (or
a singular "the shortest path") versus a plural with no number, which the handler would
have to guess. The classifier routes only certain readings to the graph handler.
Patterns are lower case and run on lower-cased text (``re.IGNORECASE`` is several times
slower).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .edges import Weight, read_edges
from .errors import GraphError, GraphLimitError
from .text import collapse_spaces, normalize_newlines

MAX_NODES = 1000
MAX_EDGES = 10_000
MAX_PATHS = 100
# Yen's work grows with paths × edges; 80 nodes, 3 100 edges and P = 100 take about 0.2 s.
MAX_PATH_WORK = 400_000

_N = r"(?:node|vertex|town|city|station|stop|intersection|location)?\s*(\d+)"
_UNDIRECTED_WORDS = ("undirected", "bidirectional", "bi-directional", "two-way", "both directions")
_NODE_COUNT = re.compile(r"\b(\d+)\s+(?:nodes|vertices)\b")
_NODE_RANGE = re.compile(
    r"\b(?:numbered|labell?ed|indexed|named|ids?|nodes|vertices)\s+(?:from\s+)?(\d+)\s*(?:to|through|-|–|\.\.)\s*"
    r"(\d+)\b",
)
_VALUE_RANGE = re.compile(
    r"\b(?:weights?|costs?|values?|lengths?)\s+(?:\w+\s+){0,2}?(?:from|between)\s+\d+\s+(?:to|and)\s+\d+",
)
_FROM_TO = re.compile(rf"\bfrom\s+{_N}\s+to\s+{_N}\b")
# "0 ⇒ 4" standing alone in the question names the query. The edge arrows ("->", "→",
# "=>") are read as edges, where one without a weight leaves the graph unread; a chain
# such as "0 ⇒ 2 ⇒ 4" names a path, not a query, and is left to the other readers.
_ARROW_QUERY = re.compile(r"(?<![⇒⟹])(?<![⇒⟹]\s)\b(\d+)\s*[⇒⟹]\s*(\d+)\b(?!\s*[⇒⟹])")
_BETWEEN = re.compile(rf"\bbetween\s+(?:nodes?|vertices|vertex)?\s*(\d+)\s+and\s+{_N}\b")
_START = re.compile(
    r"\b(?:source|start|origin|starting|start\s+point|begin(?:ning)?)(?:\s+(?:node|vertex|point))?"
    r"\s*(?:is|=|:|at|from)?\s*(?:node|vertex)?\s*(\d+)\b|(?:\bs|\"from\")\s*[=:]\s*(\d+)\b",
)
_END = re.compile(
    r"\b(?:target|destination|sink|goal|end|ending|finish|finishing|reach|reaching|arrive|arriving|"
    r"get\s+to|getting\s+to|going\s+to)(?:\s+(?:node|vertex|point))?"
    r"\s*(?:is|=|:|at|in)?\s*(?:node|vertex)?\s*(\d+)\b|(?:\bt|\"to\")\s*[=:]\s*(\d+)\b",
)
_COUNT_WORDS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
}
_COUNT = r"(\d+|" + "|".join(_COUNT_WORDS) + r")"
_PATH_COUNT = re.compile(
    rf"\btop[ \t-]*{_COUNT}\b|\bfirst[ \t]+{_COUNT}\b"
    rf"|\b{_COUNT}[ \t-]+(?:[a-z]+[ \t-]+){{0,3}}?(?:paths|routes)\b"
    r"|\b[kp]\s*=\s*(\d+)\b|\"[kp]\"\s*:\s*(\d+)\b",
)
_PATH_REQUEST = re.compile(
    r"\b(?:shortest|cheapest|lightest|fastest|quickest|least[\s-]+(?:cost(?:ly)?|expensive|weight|time)"
    r"|lowest[\s-]+(?:cost|weight|latency)"
    r"|lowest[\s-]+total[\s-]+(?:weight|cost)|min(?:imum)?[\s-]+(?:total[\s-]+)?(?:cost|weight)|best)\b"
    r"(?:[\s-]+[a-z0-9]+){0,2}?[\s-]+(paths?|routes?)\b"
    r"|\b(paths?|routes?)\b[^.\n]{0,40}?\b(?:smallest|lowest|minimum|least)\s+(?:total\s+)?(?:weight|cost)"
    r"|\b(paths?|routes?)\b[^.\n]{0,30}?\b(?:ranked|ordered|sorted)?\s*by\s+(?:total\s+)?(?:weight|cost)"
    r"|\bk[\s-]*shortest\b|\bsubmit_paths\b",
)
_ALL_PATHS = re.compile(r"\ball\s+(?:the\s+|of\s+the\s+)?(?:[a-z]+\s+){0,2}?(?:paths|routes)\b")
# Questions about paths whose answer is not "the top P shortest simple paths from S to T":
# a length, a count or existence; a constraint (avoid, via, visit all, at most k hops); a
# changed graph ("if every weight is doubled", "remove edge 1->2"); a claim to check; the
# trace of an algorithm ("nodes expanded", "distance table after each iteration").
_OTHER_PATH_QUESTION = re.compile(
    r"\b(?:length|weight|cost|distance|total)\s+of\s+(?:the\s+|each\s+|a\s+)?(?:[a-z]+\s+)?(?:shortest|cheapest|best)"
    r"|\bhow\s+(?:long|far|many|much)\b|\bis\s+there\s+(?:a|any)\b|\bdoes\s+(?:a|any)\s+path\s+exist"
    r"|\bnumber\s+of\s+(?:\w+\s+)?paths\b(?!\s*:)|\blongest\b|\bcount\s+(?:the\s+)?(?:\w+\s+)?paths\b"
    r"|\b(?:avoid(?:s|ing)?|bypass(?:es|ing)?)\b|\b(?:through|via)\s+(?:node|vertex)"
    r"|\bpass(?:es|ing)?\s+(?:through|via)\b|\bvisit(?:s|ing)?\s+(?:every|each|all|exactly|node|vertex)"
    r"|\b(?:without|except(?:\s+for)?|exclud(?:e|es|ing))\s+(?:\w+\s+){0,2}?(?:node|edge|vertex)"
    r"|\b(?:at\s+(?:most|least)|exactly|no\s+more\s+than)\s+\d+\s+(?:edges|hops|steps|nodes|stops)"
    r"|\bmust\s+(?:use|pass|go|visit|include|contain|start|end)"
    r"|\b(?:if|when|after|suppose|assuming)\b[^.?!\n]{0,60}?\b(?:doubled|halved|removed|deleted|added|"
    r"increased|decreased|changed|blocked|closed|reversed|negated|set\s+to)\b"
    r"|\b(?:remove|delete|reverse|block|close|double|halve|increase|decrease)\s+(?:the\s+|edge|node|every|all)"
    r"|\btrue\s+or\s+false\b|\b(?:true|false|correct|right)\s*\?|\bis\s+the\s+following\s+(?:statement\s+)?true"
    r"|\b(?:expanded|iterations?|distance\s+table|priority\s+queue|relax(?:ation|ed|es)?|predecessors?|"
    r"visited\s+order|order\s+of\s+visit|trace)\b",
)


@dataclass(frozen=True)
class GraphProblem:
    """A parsed graph prompt: successor lists with the cheapest weight per edge, and the query.

    ``num_paths_stated`` is False when the prompt asks for paths in the plural without
    saying how many, so ``num_paths`` is a guess (1).
    """

    successors: dict[int, dict[int, Weight]]
    source: int
    target: int
    num_paths: int
    directed: bool
    num_paths_stated: bool = True


def path_request(text: str) -> str | None:
    """The phrase asking for shortest paths ("the 3 cheapest routes", "submit_paths"), if any."""
    match = _PATH_REQUEST.search(text.lower())
    return match.group(0) if match else None


def other_path_question(text: str) -> str | None:
    """A question about paths whose answer is not the top-P shortest paths themselves.

    A length, a count, existence, a constraint (avoid or pass through a node), a changed
    graph, a claim to check, an algorithm's trace: the graph handler would answer a
    different question, so the classifier leaves these to the LLM.
    """
    match = _OTHER_PATH_QUESTION.search(text.lower())
    return match.group(0) if match else None


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


def _blank(text: str, pattern: re.Pattern[str]) -> str:
    return pattern.sub(lambda match: " " * len(match.group(0)), text)


def _query(question: str, directed: bool) -> tuple[int, int]:
    """The one (source, target) pair the question names, in any of its phrasings."""
    pairs = {(int(m.group(1)), int(m.group(2))) for m in _FROM_TO.finditer(question)}
    pairs |= {(int(m.group(1)), int(m.group(2))) for m in _ARROW_QUERY.finditer(question)}
    starts = {int(m.group(1) or m.group(2)) for m in _START.finditer(question)}
    ends = {int(m.group(1) or m.group(2)) for m in _END.finditer(question)}
    if len(starts) == 1 and len(ends) == 1:
        pairs.add((next(iter(starts)), next(iter(ends))))
    for match in _BETWEEN.finditer(question):
        pair = (int(match.group(1)), int(match.group(2)))
        if directed and pair not in pairs:
            raise GraphError(
                f"'between {pair[0]} and {pair[1]}' does not say which way to go in a directed graph"
            )
        pairs.add(pair)
    if not pairs:
        raise GraphError("graph prompt names no query of the form 'from node S to node T'")
    if len(pairs) > 1:
        listed = ", ".join(f"{s} to {t}" for s, t in sorted(pairs))
        raise GraphError(f"graph prompt names several different queries ({listed}); expected one")
    return next(iter(pairs))


def _path_count(question: str) -> tuple[int, bool]:
    """(P, whether the prompt states it): a stated number, else 1 for a singular request."""
    counts = {_parse_count(next(g for g in m.groups() if g)) for m in _PATH_COUNT.finditer(question)}
    if len(counts) > 1:
        raise GraphError(f"graph prompt asks for different numbers of paths: {sorted(counts)}")
    if counts:
        num_paths = counts.pop()
        if num_paths < 1:
            raise GraphError(f"number of paths requested must be between 1 and {MAX_PATHS}, got {num_paths}")
        if num_paths > MAX_PATHS:
            raise GraphLimitError(
                f"number of paths requested must be between 1 and {MAX_PATHS}, got {num_paths}"
            )
        return num_paths, True
    request = _PATH_REQUEST.search(question)
    noun = next((g for g in request.groups() if g), "") if request else ""
    plural = noun.lower().endswith("s") or _ALL_PATHS.search(question) is not None
    return 1, not plural


def parse_graph(prompt: str) -> GraphProblem:
    """Parse a graph prompt (directed ``a -> b`` or undirected ``a - b`` / ``a -- b`` edges).

    Raises :class:`GraphError` with the reason when an edge, the query or a weight cannot
    be read, or when a node lies outside the declared node range, and
    :class:`GraphLimitError` when the graph or P is over the limits.
    """
    return read_graph(prompt)[0]


def read_graph(prompt: str) -> tuple[GraphProblem, str]:
    """:func:`parse_graph`, and the prompt's text without its edges: the question to read the wording of."""
    text = collapse_spaces(normalize_newlines(prompt))
    edges, question = read_edges(text)
    if not edges:
        raise GraphError("graph prompt has no edge lines of the form 'a -> b, weight: w'")
    lower = text.lower()
    if len(edges) > MAX_EDGES:
        raise GraphLimitError(f"graph has {len(edges)} edges; at most {MAX_EDGES} are accepted")
    undirected_graph = any(word in lower for word in _UNDIRECTED_WORDS)
    bounds = _node_bounds(lower)
    if bounds and bounds[1] - bounds[0] + 1 > MAX_NODES:
        declared = bounds[1] - bounds[0] + 1
        raise GraphLimitError(f"graph has {declared} nodes; at most {MAX_NODES} are accepted")
    successors: dict[int, dict[int, Weight]] = {}
    nodes: set[int] = set()
    for edge in edges:
        if edge.weight < 0:
            raise GraphError(
                f"negative edge weight {edge.weight} on {edge.head} -> {edge.tail}; weights must be >= 0"
            )
        for node in (edge.head, edge.tail):
            if bounds and not bounds[0] <= node <= bounds[1]:
                raise GraphError(f"node {node} lies outside the graph's nodes {bounds[0]}..{bounds[1]}")
        nodes.update((edge.head, edge.tail))
        arcs = [(edge.head, edge.tail)]
        if undirected_graph or edge.two_way:
            arcs.append((edge.tail, edge.head))
        for u, v in arcs:
            if u == v:
                continue
            out = successors.setdefault(u, {})
            if v not in out or edge.weight < out[v]:
                out[v] = edge.weight
    if len(nodes) > MAX_NODES:
        raise GraphLimitError(f"graph has {len(nodes)} nodes; at most {MAX_NODES} are accepted")
    query_text = _blank(_blank(question.lower(), _NODE_RANGE), _VALUE_RANGE)
    source, target = _query(query_text, directed=not undirected_graph)
    for name, node in (("source", source), ("target", target)):
        if bounds and not bounds[0] <= node <= bounds[1]:
            raise GraphError(f"{name} node {node} lies outside the graph's nodes {bounds[0]}..{bounds[1]}")
    num_paths, stated = _path_count(query_text)
    if num_paths * len(edges) > MAX_PATH_WORK:
        raise GraphLimitError(
            f"{num_paths} paths over {len(edges)} edges is more work than one prompt may ask for "
            f"(paths x edges must stay within {MAX_PATH_WORK})"
        )
    problem = GraphProblem(successors, source, target, num_paths, directed=not undirected_graph,
                           num_paths_stated=stated)
    return problem, question
