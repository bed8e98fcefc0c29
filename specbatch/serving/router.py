"""The router stage: each prompt's task, predicted output length, or its own error.

The router sees every prompt first, so it is where a prompt that can never be served
(not UTF-8, empty, an unknown task override) is caught; the error travels with the
prompt and the scheduler answers it in place. Observed output lengths come back from
the scheduler so the length predictor keeps the bins equal-mass as traffic changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specbatch.routing import LengthPredictor, classify
from specbatch.serving.params import PromptError, broadcast, decode_prompt, decode_task_override

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Route:
    task: str
    predicted_tokens: int
    error: str = ""


class PromptRouter:
    """Classifies prompts (structure first, the draft-model fallback for the ambiguous)."""

    def __init__(
        self, predictor: LengthPredictor | None = None, fallback: Callable[[str], str | None] | None = None
    ) -> None:
        self._predictor = predictor or LengthPredictor()
        self._fallback = fallback

    def route(
        self, prompts: Sequence[bytes | str], overrides: Sequence[bytes | str] | None = None
    ) -> list[Route]:
        """One Route per prompt, in order; per-prompt problems become that prompt's error."""
        overrides = (
            broadcast(overrides, len(prompts), "task") if overrides is not None else [None] * len(prompts)
        )
        routes = []
        for raw, override in zip(prompts, overrides, strict=True):
            try:
                text = decode_prompt(raw)
                task = decode_task_override(override) or classify(text, fallback=self._fallback)
                routes.append(Route(task=task, predicted_tokens=self._predictor.predict(text, task)))
            except PromptError as exc:
                routes.append(Route(task="", predicted_tokens=0, error=str(exc)))
        return routes

    def observe(
        self, prompts: Sequence[bytes | str], tasks: Sequence[str], output_tokens: Sequence[int]
    ) -> None:
        """Feed served output lengths back into the predictor."""
        for raw, task, tokens in zip(prompts, tasks, output_tokens, strict=True):
            try:
                self._predictor.observe(decode_prompt(raw), task, int(tokens))
            except PromptError:
                continue
