"""The prompts a load test sends: a pool per task, drawn by the profile's task mix.

Pools are built per task rather than drawn from one mixed workload, so every task the
mix names has prompts even when its share is small, and the per-task latencies the SLA
checks are never empty for lack of a prompt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from specbatch.loadtest.profiles import ProfileError, Workload, read_prompt_file
from specbatch.routing.workload import generate_workload


@dataclass(frozen=True)
class PromptChoice:
    """One request to send: its task, prompt and max_tokens (None: the server's per-task default)."""

    task: str
    text: str
    max_tokens: int | None


class PromptPool:
    """Prompts grouped by task; `draw` picks a task by the mix, a prompt of that task, and its max_tokens."""

    def __init__(
        self,
        prompts_by_task: dict[str, list[str]],
        mix: dict[str, float],
        max_tokens: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        self.tasks = [task for task, share in mix.items() if share > 0]
        missing = [task for task in self.tasks if not prompts_by_task.get(task)]
        if missing:
            raise ProfileError(
                f"the prompt source has no prompts for {', '.join(missing)}, which the mix sends"
            )
        self.weights = [mix[task] for task in self.tasks]
        self.prompts_by_task = prompts_by_task
        self.max_tokens = max_tokens or {}

    def draw(self, rng: random.Random) -> PromptChoice:
        task = rng.choices(self.tasks, self.weights)[0]
        text = rng.choice(self.prompts_by_task[task])
        bounds = self.max_tokens.get(task)
        return PromptChoice(task=task, text=text, max_tokens=rng.randint(*bounds) if bounds else None)


def build_prompt_pool(workload: Workload) -> PromptPool:
    """The pool for a workload's prompt source: `count` generated prompts per task, or the file's prompts."""
    source, mix = workload.prompts, workload.mix
    prompts_by_task: dict[str, list[str]] = {}
    if source.kind == "generated":
        for task, share in mix.items():
            if share > 0:
                prompts_by_task[task] = [
                    p.text for p in generate_workload(source.count, source.seed, {task: 1.0})
                ]
    else:
        if source.path is None:
            raise ProfileError("a file prompt source needs a path")
        for task, text in read_prompt_file(source.path):
            prompts_by_task.setdefault(task, []).append(text)
    return PromptPool(prompts_by_task, mix, workload.max_tokens)
