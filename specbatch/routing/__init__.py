"""Prompt routing: classify each prompt, predict its output length, answer what needs no LLM.

The server's router model calls :func:`classify` (or :func:`resolve_task` when the
request names a task) and :class:`LengthPredictor`; the scheduler answers graph prompts
with :func:`solve_graph` and builds the engine prompts for mmlu and infobench here.
"""

from .classify import TASKS, build_fallback_prompt, classify, resolve_task, route_evidence
from .errors import GraphError, MMLUParseError, RoutingError
from .graph import format_submit_paths, k_shortest_paths, parse_graph, solve_graph
from .infobench import InfoBenchPrompt, build_infobench_prompt, infobench_chat_content, parse_infobench
from .length import LengthPredictor
from .mmlu import (
    CHAT_ANSWER_PREFIX,
    MMLUQuestion,
    build_chat_question,
    build_scoring_prompt,
    extract_choice_letter,
    format_mmlu_answer,
    majority_vote,
    parse_mmlu,
    scoring_continuations,
)
from .workload import WorkloadPrompt, generate_workload

__all__ = [
    "CHAT_ANSWER_PREFIX",
    "TASKS",
    "GraphError",
    "InfoBenchPrompt",
    "LengthPredictor",
    "MMLUParseError",
    "MMLUQuestion",
    "RoutingError",
    "WorkloadPrompt",
    "build_chat_question",
    "build_fallback_prompt",
    "build_infobench_prompt",
    "build_scoring_prompt",
    "classify",
    "extract_choice_letter",
    "format_mmlu_answer",
    "format_submit_paths",
    "generate_workload",
    "infobench_chat_content",
    "k_shortest_paths",
    "majority_vote",
    "parse_graph",
    "parse_infobench",
    "parse_mmlu",
    "resolve_task",
    "route_evidence",
    "scoring_continuations",
    "solve_graph",
]
