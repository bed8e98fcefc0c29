"""The router's fallback for prompts the structural classifier cannot place.

The draft model gets a short classification prompt and answers with a few greedy
tokens; the first task name in its answer wins. Anything else counts as no opinion,
and the classifier then keeps its default.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from specbatch.serving.params import TASKS

_PROMPT = (
    "Classify the request into one task.\n"
    "graph: shortest paths in a weighted directed graph.\n"
    "mmlu: a multiple-choice question with lettered options.\n"
    "infobench: an open instruction to follow.\n\n"
    "Request:\n{prompt}\n\nTask:"
)
_PROMPT_CHARS = 2000
_TASK_WORD = re.compile(r"\b(" + "|".join(TASKS) + r")\b", re.IGNORECASE)


def classification_prompt(prompt: str) -> str:
    return _PROMPT.format(prompt=prompt[:_PROMPT_CHARS])


def parse_task(answer: str) -> str | None:
    match = _TASK_WORD.search(answer)
    return match.group(1).lower() if match else None


def draft_fallback(generate: Callable[[str], str]) -> Callable[[str], str | None]:
    """Wrap `generate(prompt) -> text` (the draft model, a few greedy tokens) as a classifier fallback."""

    def fallback(prompt: str) -> str | None:
        return parse_task(generate(classification_prompt(prompt)))

    return fallback
