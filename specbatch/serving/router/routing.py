"""The router stage: each prompt's task, or its own error.

The router sees every prompt first, so it is where a prompt that can never be served
(not UTF-8, empty, an unknown task override) is caught; the error travels with the
prompt and the scheduler answers it in place. A prompt whose structure does not decide
its task is routed as "ambiguous": the scheduler runs the draft model on it as one
more row, so no request waits behind it here. Output lengths are predicted by the
scheduler, which learns them from the rows it sees finish.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specbatch.routing import route_evidence
from specbatch.routing.classify import AMBIGUOUS
from specbatch.serving.params import PromptError, broadcast, decode_prompt, decode_task_override


@dataclass(frozen=True)
class Route:
    task: str
    error: str = ""


class PromptRouter:
    """Classifies prompts by their structure alone; stateless."""

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
                routes.append(
                    Route(task=decode_task_override(override) or route_evidence(text).decision or AMBIGUOUS)
                )
            except PromptError as exc:
                routes.append(Route(task="", error=str(exc)))
        return routes
