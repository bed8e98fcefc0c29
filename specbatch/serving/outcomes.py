"""What one prompt produced, and the reassembly of a multi-prompt request in order."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PromptOutcome:
    """The answer to one prompt, in the shape of the ensemble's outputs (DESIGN §2)."""

    text: str = ""
    task: str = ""
    finish_reason: str = "stop"
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0
    error: str = ""

    @property
    def acceptance_rate(self) -> float:
        if self.total_draft_tokens == 0:
            return 0.0
        return self.total_accepted_draft_tokens / self.total_draft_tokens

    @classmethod
    def failed(cls, message: str, task: str = "") -> PromptOutcome:
        return cls(task=task, finish_reason="error", error=message)


class RequestAssembly:
    """Collects the outcomes of one request's prompts, which finish in any order.

    Prompts of one request go to different queues and batches; the response must list
    them in input order, so each outcome is stored by index until all have arrived.
    """

    def __init__(self, count: int) -> None:
        if count <= 0:
            raise ValueError("a request needs at least one prompt")
        self._outcomes: list[PromptOutcome | None] = [None] * count
        self._missing = count

    def fill(self, index: int, outcome: PromptOutcome) -> bool:
        """Store prompt `index`'s outcome; True once every prompt has one."""
        if self._outcomes[index] is not None:
            raise ValueError(f"prompt {index} already has an outcome")
        self._outcomes[index] = outcome
        self._missing -= 1
        return self._missing == 0

    @property
    def complete(self) -> bool:
        return self._missing == 0

    def outcomes(self) -> list[PromptOutcome]:
        """All outcomes in input order; only valid once complete."""
        if not self.complete:
            raise RuntimeError(f"{self._missing} prompt(s) still pending")
        return [o for o in self._outcomes if o is not None]
