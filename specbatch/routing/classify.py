"""Route a prompt to ``graph``, ``mmlu`` or ``infobench``: a canned handler only when it is certain.

Two tasks are answered without generation — graph prompts by computation, mmlu prompts by
scoring letters — so a wrong route there gives a confident wrong answer, while a prompt
sent to ``infobench`` is at worst answered by the LLM. The classifier is therefore
precision-first:

- ``graph`` only when the whole edge list reads (:mod:`.edges`), the question names one
  source, one target and how many paths, and the wording asks for shortest paths and
  nothing more (no "explain", "draw", "how long is");
- ``mmlu`` only when a lettered option list ends the prompt (:mod:`.options`), a stem
  stands above it, something marks it as a question to choose from (``Question:``,
  ``Answer:``, "Answer with the letter", "which of the following", a stem whose last
  sentence is a question) and nothing asks for more than a letter (:mod:`.intent`);
- the fallback (normally the draft model) only for what stays genuinely ambiguous — an
  option list that nothing marks either as a question or as something else — and only
  among the tasks whose handler can read that prompt;
- ``infobench`` for everything else, including the request rendering's ``Instruction: …
  Generation:`` frame.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from . import intent
from .errors import GraphError, GraphLimitError
from .graph_parse import other_path_question, path_request, read_graph
from .infobench import ends_with_generation_cue, has_instruction_marker
from .mmlu import has_question_marker, mentions_multiple_choice, split_question
from .options import OptionList, find_options
from .text import collapse_spaces, normalize_newlines

logger = logging.getLogger(__name__)

TASKS = ("graph", "mmlu", "infobench")
DEFAULT_TASK = "infobench"
AMBIGUOUS = "ambiguous"  # the router's task for a prompt only the draft model can place

Fallback = Callable[[str], str | None]
# A graph prompt names paths, routes or nodes; anything else skips the graph reader.
_GRAPH_WORDS = ("path", "route", "node", "vert")


@dataclass(frozen=True)
class Evidence:
    """What the classifier saw; ``decision`` is a task name, or ``None`` when ambiguous.

    ``candidates`` are the tasks a fallback may choose for an ambiguous prompt: those
    whose handler can read it, and ``infobench``, which can answer anything.
    """

    decision: str | None
    reason: str
    candidates: tuple[str, ...] = TASKS


def _graph_evidence(text: str, lower: str, only_a_path_request: bool = False) -> Evidence | None:
    """Graph evidence, or ``None`` when the prompt neither asks for paths nor holds a readable graph.

    ``only_a_path_request``: only ``graph`` evidence would matter (the prompt is already a
    multiple-choice question, and only a graph task too would change its route), and that
    needs a request for shortest paths; without one the graph is not read. Clinical and
    scientific stems name pathways, lymph nodes and vertebrae, and reading them for an edge
    list cost more than the rest of their routing.
    """
    if not any(word in lower for word in _GRAPH_WORDS):
        return None
    if only_a_path_request and path_request(text) is None:
        return None
    try:
        problem, question = read_graph(text)
    except GraphLimitError as error:
        # Certainly a graph task, too large to solve: its handler answers with the limit.
        if path_request(text) is None or intent.extra_demand(text) or other_path_question(text):
            return None
        return Evidence("graph", f"a shortest-path request over a graph above the limits ({error})")
    except GraphError as error:
        request = path_request(text)
        if request is None:
            return None
        return Evidence("infobench", f"asks for paths ({request!r}) but the graph does not read: {error}")
    request = path_request(question)
    demand = intent.extra_demand(question)
    if demand:
        return Evidence("infobench", f"a readable graph, but the prompt asks for more than paths: {demand!r}")
    other = other_path_question(question)
    if other:
        return Evidence("infobench", f"a readable graph, but not a plain top-P shortest-path ask: {other!r}")
    if request is None:
        return Evidence("infobench", "a readable graph and query, but no request for shortest paths")
    if not problem.num_paths_stated:
        return Evidence("infobench", f"asks for shortest paths ({request!r}) without saying how many")
    return Evidence("graph", "a fully read weighted graph, one source and target, and a count of paths")


def _mmlu_evidence(options: OptionList | None) -> Evidence | None:
    """Multiple-choice evidence, or ``None`` when no lettered option list ends the prompt.

    What the prompt asks is read outside the question: in the preamble, in the stem's
    sentences that speak to the reader, and after the options. The stem's own wording and
    the options are what the question is about and never count, except for a second open
    question appended to it ("…, and why?"), which a letter cannot answer.
    """
    if options is None:
        return None
    preamble, stem = split_question(options.before)
    if not stem:
        return Evidence("infobench", "a lettered list with nothing above it")
    outside = "\n".join((preamble, intent.instructions_in(stem), options.after))
    demand = (
        intent.asks_for_more(outside)
        or intent.open_question_after(options.after)
        or intent.appended_question(stem)
        # An inline last option runs to the end of its line and may carry the appended question.
        or (intent.appended_question(options.choices[-1]) if options.inline else None)
    )
    if demand:
        return Evidence("infobench", f"a lettered list, but the prompt asks for more: {demand!r}")
    if (
        options.has_header
        or options.has_answer_cue
        or has_question_marker(options.before)
        or intent.is_question(stem)
        or intent.choosing_question(options.after)
        or intent.choice_request(f"{options.before}\n{options.after}")
        or mentions_multiple_choice(options.before)
    ):
        return Evidence("mmlu", "a lettered option list that the prompt asks to choose from")
    return Evidence(None, "a lettered option list that nothing marks as a question", ("mmlu", "infobench"))


def route_evidence(prompt: str) -> Evidence:
    """Classify by structure and wording, and say why; ambiguous prompts get ``decision=None``."""
    text = collapse_spaces(normalize_newlines(prompt))
    if ends_with_generation_cue(text) and has_instruction_marker(text):
        return Evidence("infobench", "Instruction: … Generation: frame")
    mmlu = _mmlu_evidence(find_options(text))
    settled_as_mmlu = mmlu is not None and mmlu.decision == "mmlu"
    graph = _graph_evidence(text, text.lower(), only_a_path_request=settled_as_mmlu)
    decided = [e for e in (graph, mmlu) if e is not None and e.decision in ("graph", "mmlu")]
    if len(decided) == 2:
        return Evidence(None, "a graph question that ends in options to choose from", ("mmlu", "infobench"))
    if decided:
        return decided[0]
    undecided = [e for e in (graph, mmlu) if e is not None and e.decision is None]
    if undecided:
        candidates = tuple(t for t in TASKS if any(t in e.candidates for e in undecided))
        return Evidence(None, "; ".join(e.reason for e in undecided), candidates)
    rejected = [e for e in (graph, mmlu) if e is not None]
    if rejected:
        return rejected[0]
    return Evidence("infobench", "no task structure: an open instruction")


def classify(prompt: str, fallback: Fallback | None = None) -> str:
    """Return ``"graph"``, ``"mmlu"`` or ``"infobench"`` for one prompt.

    ``fallback`` is asked only when the structure is ambiguous; an answer that is not one
    of the evidence's candidate tasks (after trimming and lower-casing) is ignored, as is
    a fallback that fails, and the prompt then goes to ``infobench``, the task that can
    answer anything.
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
        if task in evidence.candidates:
            return task
        logger.info("routing fallback answered %r, not one of %s; routing to %s",
                    answer, evidence.candidates, DEFAULT_TASK)
    return DEFAULT_TASK


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
