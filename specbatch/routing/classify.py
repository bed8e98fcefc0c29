"""Route a prompt to ``graph``, ``mmlu`` or ``infobench`` from the structure of its text.

Each task arrives in two renderings, and only one of them carries the phrases a keyword
router would look for ("multiple choice", "Instruction:"). The classifier therefore
reads shapes: an edge list of ``a -> b, weight: w`` lines together with a source/target
query and a ``submit_paths`` request; a contiguous A, B, C, ... option list that ends
the text together with any of the question markers around it; the ``Instruction: …
Generation:`` frame. Text with none of these shapes is an open instruction. Text with
only part of a shape (an option list and nothing that marks it as a question, an edge
list without a query) is ambiguous and goes to the fallback, normally the draft model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from . import graph, infobench, mmlu
from .errors import RoutingError
from .text import normalize_newlines

logger = logging.getLogger(__name__)

TASKS = ("graph", "mmlu", "infobench")
DEFAULT_TASK = "infobench"

Fallback = Callable[[str], str | None]


@dataclass(frozen=True)
class Evidence:
    """What the classifier saw; ``decision`` is a task name, or ``None`` when ambiguous."""

    decision: str | None
    reason: str


def _graph_shape(text: str, lower: str) -> tuple[int, bool, bool]:
    """(weighted edge lines, counted up to two; has a from/to query; asks for submit_paths)."""
    asks_submit = "submit_paths" in lower
    if not asks_submit and "->" not in text and " - " not in text and "--" not in text:
        return 0, False, False
    edges = 0
    for match in graph.edge_lines(text):
        edges += graph.has_weight(match.group(4))
        if edges == 2:
            break
    if edges == 0:
        return 0, False, asks_submit
    has_query = "from" in lower and graph.has_query(text)
    return edges, has_query, asks_submit


def route_evidence(prompt: str) -> Evidence:
    """Classify by structure alone and say why; ambiguous prompts get ``decision=None``."""
    text = normalize_newlines(prompt)
    lower = text.lower()
    if (
        "instruction" in lower
        and infobench.has_instruction_marker(text)
        and (infobench.ends_with_generation_cue(text) or mmlu.has_question_marker(text))
    ):
        return Evidence("infobench", "Instruction:/Question:/Generation: frame")
    edges, has_query, asks_submit = _graph_shape(text, lower)
    is_graph = edges > 0 and has_query and asks_submit
    block = mmlu.find_option_block(mmlu.tail_lines(text))
    mmlu_markers = block is not None and (
        block.has_header
        or block.has_answer_cue
        or mmlu.has_question_marker(text)
        or mmlu.mentions_multiple_choice(text)
    )
    if is_graph and mmlu_markers:
        return Evidence(None, "both an edge-list query and a marked option list")
    if is_graph:
        return Evidence("graph", "weighted edge lines, a from/to query and a submit_paths request")
    if mmlu_markers:
        return Evidence("mmlu", "a marked lettered option list ends the prompt")
    if block is not None:
        return Evidence(None, "a lettered option list with no question markers")
    if edges > 1 and (has_query or asks_submit):
        return Evidence(None, "an edge list with only part of a path query")
    if mmlu.mentions_multiple_choice(text) and mmlu.ends_with_answer_cue(text):
        return Evidence(None, "a multiple-choice preamble and answer cue but no readable options")
    return Evidence("infobench", "no task structure: an open instruction")


def classify(prompt: str, fallback: Fallback | None = None) -> str:
    """Return ``"graph"``, ``"mmlu"`` or ``"infobench"`` for one prompt.

    ``fallback`` is asked only when the structure is ambiguous; an answer that is not a
    task name (after trimming and lower-casing) is ignored, as is a fallback that fails,
    and the prompt then goes to ``infobench``, the task that can answer anything.
    """
    evidence = route_evidence(prompt)
    if evidence.decision is not None:
        return evidence.decision
    if fallback is not None:
        try:
            answer = fallback(prompt)
        except Exception:
            logger.warning("routing fallback failed (%s); routing to %s", evidence.reason, DEFAULT_TASK,
                           exc_info=True)
            return DEFAULT_TASK
        task = answer.strip().lower() if isinstance(answer, str) else None
        if task in TASKS:
            return task
        logger.info("routing fallback answered %r, not a task name; routing to %s", answer, DEFAULT_TASK)
    return DEFAULT_TASK


def resolve_task(prompt: str, task: str | None = None, fallback: Fallback | None = None) -> str:
    """The task for a prompt: an explicit ``task`` input wins over classification.

    Raises :class:`RoutingError` for an explicit task that is not one of :data:`TASKS`.
    """
    if task is not None and task.strip():
        name = task.strip().lower()
        if name not in TASKS:
            raise RoutingError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
        return name
    return classify(prompt, fallback)


def build_fallback_prompt(prompt: str, max_chars: int = 1500) -> str:
    """A short classification prompt for the draft model, whose answer feeds :func:`classify`.

    Long prompts are cut to their head and tail, where the task markers sit.
    """
    if len(prompt) > max_chars:
        half = max_chars // 2
        prompt = f"{prompt[:half]}\n[...]\n{prompt[-half:]}"
    return (
        "Classify the task below as exactly one word: graph (shortest paths in a weighted graph), "
        "mmlu (a multiple-choice question with lettered options) or infobench (any other "
        f"instruction).\n\nTask:\n{prompt}\n\nOne word:"
    )
