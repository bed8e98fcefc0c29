"""Prompt routing: classify each prompt, predict its output length, answer what needs no LLM.

The server's router reads :func:`route_evidence` (its decision, or none when the prompt
is ambiguous) and :class:`LengthPredictor`; the scheduler answers graph prompts with
:func:`solve_graph` (which :class:`GraphSolverPool` runs off an event loop, under a time
limit) and builds the engine prompts for mmlu and infobench here.
"""

from .classify import TASKS, build_fallback_prompt, classify, route_evidence
from .errors import GraphError, GraphLimitError, GraphTimeoutError, MMLUParseError, RoutingError
from .graph import format_submit_paths, k_shortest_paths, parse_graph, solve_graph
from .infobench import InfoBenchPrompt, build_infobench_prompt, infobench_chat_content, parse_infobench
from .length import LengthPredictor
from .mmlu import (
    CHAT_ANSWER_PREFIX,
    MMLUQuestion,
    build_chat_question,
    build_scoring_prompt,
    format_mmlu_answer,
    parse_mmlu,
    scoring_continuations,
)
from .solver_pool import GraphSolverPool, SolverBusyError, SolverUnavailableError
from .workload import WorkloadPrompt, generate_workload

__all__ = [
    "CHAT_ANSWER_PREFIX",
    "TASKS",
    "GraphError",
    "GraphLimitError",
    "GraphSolverPool",
    "GraphTimeoutError",
    "InfoBenchPrompt",
    "LengthPredictor",
    "MMLUParseError",
    "MMLUQuestion",
    "RoutingError",
    "SolverBusyError",
    "SolverUnavailableError",
    "WorkloadPrompt",
    "build_chat_question",
    "build_fallback_prompt",
    "build_infobench_prompt",
    "build_scoring_prompt",
    "classify",
    "format_mmlu_answer",
    "format_submit_paths",
    "generate_workload",
    "infobench_chat_content",
    "k_shortest_paths",
    "parse_graph",
    "parse_infobench",
    "parse_mmlu",
    "route_evidence",
    "scoring_continuations",
    "solve_graph",
]
