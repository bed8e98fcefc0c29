"""A seeded mixed workload of graph, mmlu and infobench prompts in their real renderings.

Used by the routing benchmark, the load tests and the server tests, so it is a library
function: the same ``(n, seed, mix)`` always gives the same prompts. Prompts follow the
renderings clients send word for word (graph questions; mmlu and infobench each in a
request rendering with its markers and a bare dataset rendering without them) and then
receive the perturbations clients really introduce: changed case, stray whitespace, CRLF
line ends, an extra preamble, lost blank lines, other option-label styles. Graph prompts
carry their exact answer, computed from the generated edge list (not from the text), so a
parser can be checked against it.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .corpus import INFOBENCH_INSTRUCTIONS, INFOBENCH_LOOKALIKES, MMLU_QUESTIONS, MMLU_SUBJECTS
from .graph import format_submit_paths, k_shortest_paths

DEFAULT_MIX = {"graph": 1 / 3, "mmlu": 1 / 3, "infobench": 1 / 3}
PERTURBED_SHARE = 0.6
LOOKALIKE_SHARE = 0.1

_PREAMBLES = (
    "You are a helpful assistant.",
    "Please answer the following.",
    "Read carefully and respond.",
    "### Task",
    "Here is the next item in the batch:",
    "Respond to the prompt below.",
)
_MMLU_REQUEST = (
    'The following is a multiple choice question (with answers) about {subject}.  Output the answer in the '
    'format of "The answer is (X)" at the end.\n\nQuestion: {stem}\n Options:\n{options}\nAnswer:'
)
_MMLU_DATASET = "Question:\n{stem}\n\nChoices:\n{options}"
_GRAPH_FOOTER = (
    "Return your answer by calling the submit_paths function with:\n"
    "- paths: A list of paths, where each path is a list of node indices\n"
    "- weights: A list of corresponding path weights\n\n"
    "For example, if the shortest path is [0, 2, 4] with weight 10, call:\n"
    "submit_paths(paths=[[0, 2, 4]], weights=[10])"
)


@dataclass(frozen=True)
class WorkloadPrompt:
    """One generated prompt.

    ``expected`` is the exact ``submit_paths(...)`` answer for graph prompts, the option
    labels for mmlu prompts and ``None`` for infobench. Graph prompts have one rendering,
    reported as ``"request"``.
    """

    text: str
    task: Literal["graph", "mmlu", "infobench"]
    rendering: Literal["request", "dataset"]
    expected: str | list[str] | None


def _graph_prompt(rng: random.Random) -> tuple[str, str]:
    num_nodes = rng.randint(5, 20)
    undirected = rng.random() < 0.2
    max_weight = rng.choice((10, 50, 100))
    source, target = (0, num_nodes - 1) if rng.random() < 0.8 else tuple(rng.sample(range(num_nodes), 2))
    chain = [source, *rng.sample([v for v in range(num_nodes) if v not in (source, target)],
                                 rng.randint(0, min(4, num_nodes - 2))), target]
    pairs = set(itertools.pairwise(chain))
    density = rng.uniform(0.1, 0.5)
    pairs |= {(u, v) for u in range(num_nodes) for v in range(num_nodes) if u != v and rng.random() < density}
    if undirected:
        pairs = {(min(u, v), max(u, v)) for u, v in pairs}
    edges = sorted((u, v, rng.randint(1, max_weight)) for u, v in pairs)
    successors: dict[int, dict[int, int]] = {}
    for u, v, w in edges:
        successors.setdefault(u, {})[v] = w
        if undirected:
            successors.setdefault(v, {})[u] = w
    num_paths = rng.randint(1, 5)
    answer = format_submit_paths(k_shortest_paths(successors, source, target, num_paths))
    op = rng.choice(("-", "--")) if undirected else "->"
    kind = "an undirected" if undirected else "a directed"
    header = "Edges (node - node, weight):" if undirected else "Edges (source -> target, weight):"
    edge_lines = "\n".join(f"{u} {op} {v}, weight: {w}" for u, v, w in edges)
    plural = "s" if num_paths > 1 else ""
    text = (
        f"You are given {kind} graph with {num_nodes} nodes (numbered 0 to {num_nodes - 1}) and the "
        f"following edges:\n\n{header}\n{edge_lines}\n\n"
        f"Find the top {num_paths} shortest path{plural} from node {source} to node {target}.\n\n"
        f"{_GRAPH_FOOTER}\n"
    )
    return text, answer


def _mmlu_prompt(rng: random.Random, rendering: str) -> tuple[str, list[str]]:
    stem_template, correct, distractors = rng.choice(MMLU_QUESTIONS)
    stem = stem_template.format(
        age=rng.randint(19, 84), sex=rng.choice(("man", "woman")), days=rng.randint(2, 21)
    )
    num_options = rng.choice((4, 5))
    choices = [correct, *rng.sample(distractors, num_options - 1)]
    rng.shuffle(choices)
    labels = [chr(ord("A") + i) for i in range(num_options)]
    options = "\n".join(f"{label}. {choice}" for label, choice in zip(labels, choices, strict=True))
    if rendering == "request":
        return _MMLU_REQUEST.format(subject=rng.choice(MMLU_SUBJECTS), stem=stem, options=options), labels
    return _MMLU_DATASET.format(stem=stem, options=options), labels


def _infobench_prompt(rng: random.Random, rendering: str) -> str:
    bank = INFOBENCH_LOOKALIKES if rng.random() < LOOKALIKE_SHARE else INFOBENCH_INSTRUCTIONS
    instruction, given_input = rng.choice(bank)
    if rendering == "request":
        return f"Instruction: {instruction}\nQuestion: {given_input or ''}\nGeneration:"
    return f"{instruction}\n\n{given_input}" if given_input else instruction


def _change_case(text: str, rng: random.Random) -> str:
    style = rng.random()
    if style < 0.25:
        return text.upper()
    if style < 0.5:
        return text.lower()
    markers = (
        "Question:", "Options:", "Choices:", "Answer:", "Instruction:", "Generation:", "Edges", "Find the"
    )
    for marker in markers:
        text = text.replace(marker, rng.choice((marker.upper(), marker.lower(), marker)))
    return text


def _add_whitespace(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    changed = []
    for line in lines:
        roll = rng.random()
        if roll < 0.15:
            line += rng.choice((" ", "  ", "\t"))
        elif roll < 0.25 and line:
            line = rng.choice((" ", "  ", "\t")) + line
        elif roll < 0.3:
            line = line.replace(": ", ":  ", 1)
        changed.append(line)
    padding = rng.choice(("", " ", "\n", "\n\n", "  \n"))
    return padding + "\n".join(changed) + rng.choice(("", " ", "\n", "\n\n"))


def _crlf(text: str, rng: random.Random) -> str:
    return text.replace("\n", "\r\n")


def _preamble(text: str, rng: random.Random) -> str:
    return f"{rng.choice(_PREAMBLES)}\n\n{text}"


def _drop_blank_lines(text: str, rng: random.Random) -> str:
    while "\n\n" in text:
        text = text.replace("\n\n", "\n")
    return text


def _relabel_options(text: str, rng: random.Random) -> str:
    style = rng.choice(("{}) ", "({}) ", "{}: "))
    for letter in "ABCDE":
        text = text.replace(f"\n{letter}. ", "\n" + style.format(letter))
    return text


_PERTURBATIONS: tuple[tuple[str, Callable[[str, random.Random], str]], ...] = (
    ("case", _change_case),
    ("whitespace", _add_whitespace),
    ("preamble", _preamble),
    ("missing_blank_lines", _drop_blank_lines),
    ("option_labels", _relabel_options),
    ("crlf", _crlf),
)


def _perturb(text: str, rng: random.Random) -> str:
    chosen = {name for name, _ in _PERTURBATIONS if rng.random() < 0.35}
    for name, perturbation in _PERTURBATIONS:
        if name in chosen:
            text = perturbation(text, rng)
    return text


def generate_workload(n: int, seed: int, mix: dict[str, float] | None = None) -> list[WorkloadPrompt]:
    """``n`` prompts drawn with task shares ``mix`` (default: equal thirds), reproducible by ``seed``.

    mmlu and infobench prompts are split evenly between the request and the dataset
    rendering; about 60 % of all prompts are perturbed; one infobench prompt in ten is an
    open instruction that looks like another task on the surface.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    shares = dict(DEFAULT_MIX if mix is None else mix)
    unknown = set(shares) - set(DEFAULT_MIX)
    if unknown or any(share < 0 for share in shares.values()) or sum(shares.values()) <= 0:
        raise ValueError(
            f"mix must give non-negative shares of {sorted(DEFAULT_MIX)} with a positive sum, got {mix}"
        )
    rng = random.Random(seed)
    tasks = list(shares)
    weights = [shares[task] for task in tasks]
    prompts = []
    for _ in range(n):
        task = rng.choices(tasks, weights)[0]
        rendering = "request" if task == "graph" or rng.random() < 0.5 else "dataset"
        expected: str | list[str] | None
        if task == "graph":
            text, expected = _graph_prompt(rng)
        elif task == "mmlu":
            text, expected = _mmlu_prompt(rng, rendering)
        else:
            text, expected = _infobench_prompt(rng, rendering), None
        if rng.random() < PERTURBED_SHARE:
            text = _perturb(text, rng)
        prompts.append(WorkloadPrompt(text=text, task=task, rendering=rendering, expected=expected))
    return prompts
