"""Per-prompt latency as users see it, and the SLA it is held to.

Times are on the scheduler's clock: arrival at the scheduler, dispatch to a model
instance, first token (the first streamed delta, or the instance's own measurement for
non-streaming prompts) and completion.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PromptTiming:
    arrival_s: float
    done_s: float
    dispatched_s: float | None = None
    first_token_s: float | None = None
    output_tokens: int = 0

    @property
    def queue_s(self) -> float:
        return (self.dispatched_s if self.dispatched_s is not None else self.done_s) - self.arrival_s

    @property
    def e2e_s(self) -> float:
        return self.done_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        """Time to first token; None for prompts that produced none."""
        if self.first_token_s is None or self.output_tokens == 0:
            return None
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first; None below two tokens."""
        if self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.done_s - self.first_token_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class SlaTargets:
    """Latency bounds a prompt is held to (None: not checked)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def violations(self, timing: PromptTiming) -> list[str]:
        """Which bounds `timing` broke: a subset of ttft, tpot, e2e."""
        broken = []
        for name in ("ttft", "tpot", "e2e"):
            bound, value = getattr(self, f"{name}_s"), getattr(timing, f"{name}_s")
            if bound is not None and value is not None and value > bound:
                broken.append(name)
        return broken
