"""Read a weighted edge list out of a prompt, in the syntaxes people actually write.

One line per edge (``0 -> 1, weight: 4``, ``- 0 → 1 (w=4)``, ``1. 0 -- 1: 4``, a table
row ``| 0 | 1 | 4 |``), edges inline (``0->1 (w=5), 1->2 (w=3)``), tuples and JSON
(``edges: [(0, 1, 4), ...]``, ``[[0, 1, 4], ...]``, ``{"from": 0, "to": 1, "weight": 4}``)
and prose (``an edge from 0 to 1 with weight 4``).

The graph handler answers without an LLM, so it may only answer a graph it has read in
full: every edge-shaped piece of text must be read with its weight, or the reader raises
:class:`GraphError` naming the piece it could not read, and the prompt is not a graph
prompt the server can answer with certainty. Text that only looks like numbers in
brackets (the ``[0, 2, 4]`` of an answer example) counts as edges only where the prompt
is talking about edges.
"""

from __future__ import annotations

import itertools
import re
from fractions import Fraction
from typing import NamedTuple

from .errors import GraphError

Weight = int | Fraction

_NUM = r"-?\d+(?:\.\d+)?"
_NODE = r"(?:node\s*)?(\d+)"
_OPS = r"<-->|<->|-->|->|=>|→|⟶|↔|—>|–>|--|—|–|-"
_TWO_WAY_OPS = frozenset({"<-->", "<->", "↔", "--", "—", "–", "-"})
_KEY = r"(?:weight|cost|w|wt|length|distance|dist|time)"
# What may follow a weight: a unit ("2 km", "5 min") and, on an edge line, a comment.
_UNIT = r"(?:\s*(?:km|kms|m|mi|miles?|minutes?|mins?|hours?|hrs?|h|s|secs?|seconds?|units?|ms))?"
_COMMENT = r"(?:\s*(?:#|//)[^\n]*)?"
_ITEM_PREFIX = r"(?:[-*•+][ \t]+|\d+[.)][ \t]+|(?:edge|arc|e)[ \t]*\d+[ \t]*[:.)][ \t]*)?"

_LINE_EDGE = re.compile(
    rf"^[ \t]*{_ITEM_PREFIX}{_NODE}[ \t]*({_OPS})[ \t]*{_NODE}(?![\w.])([^\n]*)$"
)
_LINE_FROM_TO = re.compile(rf"^[ \t]*{_ITEM_PREFIX}from[ \t]+{_NODE}[ \t]+to[ \t]+{_NODE}(?![\w.])([^\n]*)$")
_WEIGHT = (
    rf"\s*[,:;]?\s*(?:[(\[{{]\s*(?:{_KEY}\s*[:=]?\s*)?({_NUM})\s*[)\]}}]"
    rf"|(?:with\s+)?(?:a\s+)?{_KEY}\s*(?:of\s+|is\s+|[:=]\s*)?({_NUM})"
    rf"|[:=]?\s*({_NUM})){_UNIT}\s*[.,;]?{_COMMENT}\s*"
)
_LINE_WEIGHT = re.compile(rf"^{_WEIGHT}$")
# The common case in one regex: a whole line that is one weighted edge ("0 -> 1, weight: 4").
_WEIGHTED_LINE = re.compile(rf"[ \t]*{_ITEM_PREFIX}{_NODE}[ \t]*({_OPS})[ \t]*{_NODE}(?![\w.]){_WEIGHT}")
_INLINE_EDGE = re.compile(
    rf"(?<![\w.]){_NODE}\s*({_OPS})\s*{_NODE}(?![\w.])\s*"
    rf"(?:[(\[{{]\s*(?:{_KEY}\s*[:=]?\s*)?({_NUM}){_UNIT}\s*[)\]}}]"
    rf"|,?\s*(?:with\s+)?(?:a\s+)?{_KEY}\s*(?:of\s+|is\s+|[:=]\s*)?({_NUM}){_UNIT}"
    rf"|[:=]\s*({_NUM}){_UNIT})",
)
_WEIGHTED_ARROW = re.compile(
    rf"(?<![\w.]){_NODE}\s*-+\s*[(\[]?\s*({_NUM})\s*[)\]]?\s*-*>\s*{_NODE}(?![\w.])"
)
_TUPLE = re.compile(
    rf"[(\[]\s*{_NODE}\s*,\s*{_NODE}\s*,\s*(?:\{{\s*['\"]?{_KEY}['\"]?\s*:\s*({_NUM})\s*\}}"
    rf"|(?:{_KEY}\s*[:=]\s*)?({_NUM}))\s*[)\]]",
)
_KEYED_PAIR = re.compile(rf"[(\[]\s*{_NODE}\s*,\s*{_NODE}\s*[)\]]\s*:\s*({_NUM})")
_OBJECT = re.compile(r"\{[^{}\n]*\}")
_OBJECT_FIELD = re.compile(rf"['\"]?(\w+)['\"]?\s*:\s*({_NUM})")
_SOURCE_KEYS = frozenset({"from", "source", "src", "u", "start"})
_TARGET_KEYS = frozenset({"to", "target", "dst", "dest", "v", "end"})
_WEIGHT_KEYS = frozenset({"weight", "w", "cost", "length", "distance", "dist"})
_PROSE_EDGE = re.compile(
    rf"\b(?:edge|arc|link|road|connection)\s+(?:going\s+|leading\s+)?from\s+{_NODE}\s+to\s+{_NODE}\b"
    rf"(?:\s*,?\s*[(\[]?\s*(?:with|of|having|that\s+has|which\s+has|and)?\s*(?:a\s+)?(?:total\s+)?{_KEY}\s*"
    rf"(?:of\s+|is\s+|[:=]\s*)?({_NUM}))?",
)
_UNREAD_PROSE = re.compile(
    r"(?<!\d)\d+\s+(?:is\s+)?(?:connected|connects|linked|links|joined|joins)\s+(?:to|with)\s+(?:node\s*)?\d+",
)
_CELL_BREAK = r"[ \t]*[|,:\t ][ \t]*"
_TABLE_ROW = re.compile(
    rf"^[ \t]*\|?[ \t]*(\d+){_CELL_BREAK}(\d+){_CELL_BREAK}({_NUM})[ \t]*\|?[ \t]*$", re.MULTILINE
)
_TABLE_RULE = re.compile(r"^[ \t]*\|?[ \t:|-]+$")
_HEADER_WORDS = re.compile(r"[a-z]+")
_COLUMN_ROLES = {
    **dict.fromkeys(("from", "source", "src", "u", "start", "tail"), "source"),
    **dict.fromkeys(("to", "target", "dst", "dest", "v", "end", "head"), "target"),
    **dict.fromkeys(("weight", "w", "cost", "length", "distance", "dist", "time"), "weight"),
}
_MENTIONS_EDGES = re.compile(r"\b(?:edges?|arcs?)\b")
_UNCOVERED_ARROW = re.compile(r"(?<!\d)\d+\s*(?:<-->|<->|-->|->|=>|→|⟶|↔|—>|–>)\s*(?:node\s*)?\d+")
# Around edges written inline: what may come before the first (a label ending in "edges",
# or nothing but a bullet or bracket), between two (separators) and after the last (a
# closing bracket, then the end of the line or a sentence break).
_LIST_LEAD = re.compile(
    r"(?:^|\b(?:edges?|arcs?|links?|connections?|roads?|streets?|weights?|lengths?|distances?|costs?|graph|g)[\"']?(?:\s*\([^)]*\))?"
    r"(?:\s+(?:are|is|list|as\s+follows))?(?:\s*[:=])?)[\s\-*•\[{(]*$"
)
_LIST_GAP = re.compile(r"^[\s,;]*(?:\b(?:and|or)\b)?[\s,;]*$")
_LIST_END = re.compile(r"^[\s\])}]*(?:$|[.,;:!?])")


class Edge(NamedTuple):
    """One edge as written: ``two_way`` when its operator is undirected (``-``, ``--``, ``<->``).

    A named tuple rather than a dataclass: a graph prompt builds thousands, and tuples are
    several times cheaper to make.
    """

    head: int
    tail: int
    weight: Weight
    two_way: bool = False


def parse_weight(token: str) -> Weight:
    """Integers stay ``int``; decimals become exact fractions so that ties compare exactly."""
    return Fraction(token) if "." in token else int(token)


def _first(*groups: str | None) -> str | None:
    return next((group for group in groups if group is not None), None)


def _weighted(head: str, op: str, tail: str, weight: str | None, where: str) -> Edge:
    if weight is None:
        raise GraphError(f"cannot read the weight of edge {where.strip()!r}")
    return Edge(int(head), int(tail), parse_weight(weight), op in _TWO_WAY_OPS)


def _header_roles(line: str) -> list[str] | None:
    words = [_COLUMN_ROLES.get(word.lower()) for word in _HEADER_WORDS.findall(line)]
    roles = [role for role in words if role is not None]
    return roles if len(roles) == 3 else None


def _table_rows(lines: list[str]) -> dict[int, Edge]:
    """Rows of three numbers (``| 0 | 1 | 4 |``, ``0 1 4``), checked against a header above them."""
    rows: dict[int, Edge] = {}
    header_line: str | None = None
    checked = False
    for index, line in enumerate(lines):
        row = _TABLE_ROW.match(line)
        if row is None:
            if line.strip() and not _TABLE_RULE.match(line):
                header_line, checked = line, False
            continue
        if not checked and header_line is not None:
            roles = _header_roles(header_line)
            if roles is not None and roles != ["source", "target", "weight"]:
                raise GraphError(f"edge table columns are {roles}; expected source, target, weight")
            checked = True
        head, tail, weight = row.groups()
        rows[index] = Edge(int(head), int(tail), parse_weight(weight))
    return rows


def _inline_items(line: str) -> tuple[list[tuple[int, int, Edge]], bool]:
    """Every edge written inside ``line``, and whether any was written with an arrow or dash."""
    found: list[tuple[int, int, Edge]] = []
    for match in _WEIGHTED_ARROW.finditer(line):
        head, weight, tail = match.groups()
        found.append((match.start(), match.end(), Edge(int(head), int(tail), parse_weight(weight))))
    for match in _INLINE_EDGE.finditer(line):
        if any(start <= match.start() < end for start, end, _ in found):
            continue
        head, op, tail = match.group(1, 2, 3)
        found.append((match.start(), match.end(),
                      _weighted(head, op, tail, _first(*match.group(4, 5, 6)), match.group(0))))
    arrows = bool(found)
    for match in _TUPLE.finditer(line):
        head, tail, in_dict, plain = match.groups()
        weight = in_dict if in_dict is not None else plain
        found.append((match.start(), match.end(), Edge(int(head), int(tail), parse_weight(weight))))
    for match in _KEYED_PAIR.finditer(line):
        head, tail, weight = match.groups()
        found.append((match.start(), match.end(), Edge(int(head), int(tail), parse_weight(weight))))
    for match in _OBJECT.finditer(line):
        if any(start <= match.start() < end for start, end, _ in found):
            continue
        edge = _object_edge(match.group(0))
        if edge is not None:
            found.append((match.start(), match.end(), edge))
    return found, arrows


def _is_edge_list(line: str, found: list[tuple[int, int, Edge]]) -> bool:
    """Whether the items found in ``line`` form one list with nothing but a label around it."""
    spans = sorted((start, end) for start, end, _ in found)
    gaps = (line[end:start] for (_, end), (start, _) in itertools.pairwise(spans))
    return (
        _LIST_LEAD.search(line[: spans[0][0]]) is not None
        and all(_LIST_GAP.match(gap) for gap in gaps)
        and _LIST_END.match(line[spans[-1][1] :]) is not None
    )


def _inline_edges(line: str, talks_about_edges: bool) -> tuple[list[Edge], str] | None:
    """The edges written inside one line, and the line with them blanked out.

    ``None`` when the line holds no edge list. Arrows must form a clean list (a label,
    the edges, a sentence break) or the line is an error; tuples that do not (an answer
    example such as ``[0, 2, 4]``) are left alone unless the line speaks of edges.
    """
    found, arrows = _inline_items(line)
    if not found:
        return None
    if not _is_edge_list(line, found):
        if arrows or _MENTIONS_EDGES.search(line):
            raise GraphError(f"cannot read every edge of the line {line.strip()!r}")
        return None
    if not arrows and not talks_about_edges:
        return None
    rest = list(line)
    for start, end, _ in found:
        rest[start:end] = " " * (end - start)
    return [edge for _, _, edge in sorted(found, key=lambda item: item[0])], "".join(rest)


def _object_edge(body: str) -> Edge | None:
    """An edge from a JSON-ish object with a source, a target and a weight.

    Objects without a weight are not edges: ``{"from": 0, "to": 3, "k": 2}`` is a query.
    """
    fields = {key.lower(): value for key, value in _OBJECT_FIELD.findall(body)}
    source = next((fields[k] for k in _SOURCE_KEYS if k in fields), None)
    target = next((fields[k] for k in _TARGET_KEYS if k in fields), None)
    if source is None or target is None:
        return None
    weight = next((fields[k] for k in _WEIGHT_KEYS if k in fields), None)
    if weight is None:
        return None
    return Edge(int(source), int(target), parse_weight(weight))


def _line_edge(line: str) -> tuple[Edge | None, bool]:
    """(the edge when ``line`` is one weighted edge, whether the line starts like an edge).

    A line "from 0 to 1, weight 3" is an edge only with its weight; without one it may be
    the question ("from node 0 to node 4:"), so it is not an edge-shaped error either.
    """
    match = _LINE_EDGE.match(line)
    if match is None:
        sentence = _LINE_FROM_TO.match(line)
        weight = _LINE_WEIGHT.match(sentence.group(3)) if sentence else None
        if sentence is None or weight is None:
            return None, False
        head, tail, _ = sentence.groups()
        return _weighted(head, "->", tail, _first(*weight.groups()), line), True
    weight = _LINE_WEIGHT.match(match.group(4))
    if weight is None:
        return None, True
    head, op, tail, _ = match.groups()
    return _weighted(head, op, tail, _first(*weight.groups()), line), True


def read_edges(text: str) -> tuple[list[Edge], str]:
    """The edges written in ``text``, and the rest of the text, lower-cased: the question.

    ``text`` has ``\\n`` line ends and collapsed blanks (:func:`.text.collapse_spaces`).

    Edge lines are dropped from the rest and edges written in sentences blanked out, so
    the query is read from the question alone ("an edge from 0 to 1" is not taken for
    "from 0 to 1") and reading it costs little however large the graph. All matching is
    on lower-cased text, with lower-case patterns (``re.IGNORECASE`` is several times
    slower). Raises
    :class:`GraphError` for an edge-shaped piece of text whose weight cannot be read.
    """
    lower = text.lower()
    lines = lower.split("\n")
    talks_about_edges = "edge" in lower
    rows = _table_rows(lines) if talks_about_edges and _TABLE_ROW.search(lower) else {}
    edges: list[Edge] = []
    question: list[str] = []
    for index, line in enumerate(lines):
        if index in rows:
            edges.append(rows[index])
            continue
        weighted = _WEIGHTED_LINE.fullmatch(line)
        if weighted is not None:
            head, op, tail, *weight = weighted.groups()
            edges.append(_weighted(head, op, tail, _first(*weight), line))
            continue
        edge, edge_shaped = _line_edge(line)
        if edge is not None:
            edges.append(edge)
            continue
        inline = _inline_edges(line, talks_about_edges)
        if inline is not None:
            edges += inline[0]
            question.append(inline[1])
        elif edge_shaped:
            raise GraphError(f"cannot read the weight of edge line {line.strip()!r}")
        else:
            question.append(line)

    def take_prose(match: re.Match[str]) -> str:
        head, tail, weight = match.groups()
        if weight is None:
            raise GraphError(f"cannot read the weight of edge {match.group(0)!r}")
        edges.append(Edge(int(head), int(tail), parse_weight(weight)))
        return " " * len(match.group(0))

    rest = _PROSE_EDGE.sub(take_prose, "\n".join(question))
    for stray in (_UNCOVERED_ARROW.search(rest), _UNREAD_PROSE.search(rest)):
        if stray is not None:
            raise GraphError(f"cannot read the weight of edge {stray.group(0).strip()!r}")
    return edges, rest
