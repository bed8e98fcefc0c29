"""A hand-labelled routing corpus: read it, and score a router's precision and recall on it.

The generated workload (:mod:`.workload`) measures the renderings the server was built
for; a labelled corpus measures what users write instead — paraphrases, other edge and
option syntaxes, and prompts that only mention graphs or multiple choice. Prompts are
kept verbatim in a plain-text file so that whitespace, tabs and odd formatting survive
and a reader can see exactly what is tested::

    # comments and blank lines between cases are ignored
    @graph A [[0, 1, 4], [1, 2, 3]]
    === some-id | graph
    expect: {"graph": "A", "directed": true, "source": 0, "target": 2, "paths": 1}
    transform: "crlf"
    ---
    the prompt, line by line, up to the next "===" line

A case's task is ``graph``, ``mmlu``, ``infobench`` (a negative: it must not get a
canned answer) or ``ambiguous`` (structure alone cannot tell; the fallback decides).
``@graph`` lines name ground-truth edge lists that graph cases refer to, so an expected
answer comes from the edges the author meant, not from what the parser read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from .graph import format_submit_paths, solve_graph
from .mmlu import parse_mmlu

LABELS = ("graph", "mmlu", "infobench", "ambiguous")
CANNED = ("graph", "mmlu")
_TRANSFORMS: dict[str, Callable[[str], str]] = {
    "crlf": lambda text: text.replace("\n", "\r\n"),
    "upper": str.upper,
    "trailing-newlines": lambda text: text + "\n\n",
}


@dataclass(frozen=True)
class LabelledPrompt:
    """One corpus case: its prompt, the task it should reach, and what its handler should find."""

    id: str
    task: str
    prompt: str
    expect: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Corpus:
    """The cases of one corpus file and the ground-truth graphs they name."""

    cases: list[LabelledPrompt]
    graphs: dict[str, list[tuple[int, int, int | float]]]


def _exact(weight: int | float) -> int | Fraction:
    return weight if isinstance(weight, int) else Fraction(str(weight))


def reference_answer(corpus: Corpus, case: LabelledPrompt) -> str:
    """The ``submit_paths`` answer a graph case should get, by brute force over its ground truth.

    Every simple path is enumerated, so this is for the small hand-written graphs of a
    corpus only; it shares nothing with the parser or Yen's algorithm it checks.
    """
    expect = case.expect
    successors: dict[int, dict[int, int | Fraction]] = {}
    for u, v, w in corpus.graphs[expect["graph"]]:
        for a, b in [(u, v)] if expect["directed"] else [(u, v), (v, u)]:
            out = successors.setdefault(a, {})
            out[b] = min(out.get(b, _exact(w)), _exact(w))
    found: list[tuple[int | Fraction, tuple[int, ...]]] = []

    def walk(path: list[int], weight: int | Fraction) -> None:
        if path[-1] == expect["target"]:
            found.append((weight, tuple(path)))
            return
        for nxt, w in successors.get(path[-1], {}).items():
            if nxt not in path:
                walk([*path, nxt], weight + w)

    walk([expect["source"]], 0)
    return format_submit_paths([(path, weight) for weight, path in sorted(found)[: expect["paths"]]])


def handler_reads_it(corpus: Corpus, case: LabelledPrompt) -> bool:
    """Whether the handler of a graph or mmlu case reads it right: the exact answer, or the options."""
    try:
        if case.task == "graph":
            return solve_graph(case.prompt) == reference_answer(corpus, case)
        question = parse_mmlu(case.prompt)
    except ValueError:
        return False
    return question.labels == case.expect["labels"] and question.choices[-1] == case.expect["last"]


class CorpusFormatError(ValueError):
    """A corpus file that does not follow the format above."""


def _finish(case: dict[str, Any] | None, lines: list[str], cases: list[LabelledPrompt]) -> None:
    if case is None:
        return
    while lines and not lines[-1].strip():
        lines.pop()
    prompt = "\n".join(lines)
    if not prompt.strip():
        raise CorpusFormatError(f"case {case['id']!r} has an empty prompt")
    for name in case.pop("transforms"):
        prompt = _TRANSFORMS[name](prompt)
    cases.append(LabelledPrompt(prompt=prompt, **case))


def _header(line: str, number: int) -> dict[str, Any]:
    name, _, task = line[4:].partition("|")
    task = task.strip()
    if not name.strip() or task not in LABELS:
        raise CorpusFormatError(f"line {number}: expected '=== <id> | <{'|'.join(LABELS)}>', got {line!r}")
    return {"id": name.strip(), "task": task, "expect": {}, "transforms": []}


def _meta(case: dict[str, Any], line: str, number: int) -> None:
    key, separator, value = line.partition(":")
    if not separator:
        raise CorpusFormatError(f"line {number}: unknown metadata {line!r}")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as error:
        raise CorpusFormatError(f"line {number}: {key.strip()} is not JSON ({error})") from None
    if key.strip() == "expect" and isinstance(parsed, dict):
        case["expect"] = parsed
    elif key.strip() == "transform" and parsed in _TRANSFORMS:
        case["transforms"].append(parsed)
    else:
        raise CorpusFormatError(f"line {number}: unknown metadata {line!r}")


def parse_corpus(text: str) -> Corpus:
    """Read a corpus from its text; raises :class:`CorpusFormatError` naming the bad line."""
    cases: list[LabelledPrompt] = []
    graphs: dict[str, list[tuple[int, int, int | float]]] = {}
    case: dict[str, Any] | None = None
    body: list[str] | None = None
    ids: set[str] = set()
    for number, line in enumerate(text.split("\n"), start=1):
        if line.startswith("=== "):
            _finish(case, body or [], cases)
            case, body = _header(line, number), None
            if case["id"] in ids:
                raise CorpusFormatError(f"line {number}: duplicate case id {case['id']!r}")
            ids.add(case["id"])
        elif body is not None:
            body.append(line)
        elif case is not None and line.strip() == "---":
            body = []
        elif case is not None and line.strip():
            _meta(case, line, number)
        elif line.startswith("@graph "):
            name, _, edges = line[7:].strip().partition(" ")
            graphs[name] = [tuple(edge) for edge in json.loads(edges)]
        elif line.strip() and not line.startswith("#"):
            raise CorpusFormatError(f"line {number}: text outside a case: {line!r}")
    if case is not None and body is None:
        raise CorpusFormatError(f"case {case['id']!r} has no '---' line before its prompt")
    _finish(case, body or [], cases)
    return Corpus(cases, graphs)


def load_corpus(path: str | Path) -> Corpus:
    """Read a corpus file (UTF-8)."""
    return parse_corpus(Path(path).read_text(encoding="utf-8"))


@dataclass(frozen=True)
class TaskScore:
    """Precision and recall of one canned task: routed there, labelled there, and both."""

    task: str
    routed: int
    labelled: int
    correct: int

    @property
    def precision(self) -> float:
        return self.correct / self.routed if self.routed else 1.0

    @property
    def recall(self) -> float:
        return self.correct / self.labelled if self.labelled else 1.0


def score(cases: Iterable[LabelledPrompt], routed: Iterable[str]) -> list[TaskScore]:
    """Per canned task, how many prompts went there, how many should have, and the overlap.

    ``ambiguous`` cases count as not graph and not mmlu: without a fallback they go to
    ``infobench``, so a router that sends one to a canned task loses precision.
    """
    pairs = list(zip(cases, routed, strict=True))
    return [
        TaskScore(
            task=task,
            routed=sum(route == task for _, route in pairs),
            labelled=sum(case.task == task for case, _ in pairs),
            correct=sum(route == task == case.task for case, route in pairs),
        )
        for task in CANNED
    ]
