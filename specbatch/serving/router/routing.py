"""The router stage: each prompt's task, a prior of its output length, or its own error.

The router sees every prompt first, so it is where a prompt that can never be served
(not UTF-8, empty, an unknown task override) is caught; the error travels with the
prompt and the scheduler answers it in place. A prompt whose structure does not decide
its task is routed as "ambiguous": the scheduler runs the draft model on it as one
more row, so no request waits behind it here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specbatch.routing import LengthPredictor, route_evidence
from specbatch.routing.classify import DEFAULT_TASK
from specbatch.serving.params import PromptError, broadcast, decode_prompt, decode_task_override
from specbatch.serving.wire import AMBIGUOUS


@dataclass(frozen=True)
class Route:
    task: str
    predicted_tokens: int
    error: str = ""


class PromptRouter:
    """Classifies prompts by structure; stateless apart from its length priors."""

    def __init__(self, predictor: LengthPredictor | None = None) -> None:
        self._predictor = predictor or LengthPredictor()

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
                task = decode_task_override(override) or route_evidence(text).decision or AMBIGUOUS
                predicted = self._predictor.predict(text, DEFAULT_TASK if task == AMBIGUOUS else task)
                routes.append(Route(task=task, predicted_tokens=predicted))
            except PromptError as exc:
                routes.append(Route(task="", predicted_tokens=0, error=str(exc)))
        return routes
