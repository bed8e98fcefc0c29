"""The router's fallback for prompts the structural classifier cannot place.

The draft model continues the routing library's classification prompt for a few
greedy tokens; the first task name in its answer wins. Anything else counts as no
opinion, and the classifier keeps its default.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from specbatch.routing import TASKS, build_fallback_prompt

_TASK_WORD = re.compile(r"\b(" + "|".join(TASKS) + r")\b", re.IGNORECASE)


def parse_task(answer: str) -> str | None:
    """The first task name in the draft's free-text answer, lower-cased."""
    match = _TASK_WORD.search(answer)
    return match.group(1).lower() if match else None


def draft_fallback(generate: Callable[[str], str]) -> Callable[[str], str | None]:
    """Wrap `generate(prompt) -> text` (the draft model, a few greedy tokens) as a classifier fallback."""

    def fallback(prompt: str) -> str | None:
        return parse_task(generate(build_fallback_prompt(prompt)))

    return fallback
