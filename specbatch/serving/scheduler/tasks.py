"""Turn a routed prompt into the work its task needs.

graph prompts are solved by computation (off the scheduler's loop); mmlu prompts
become a prefill-only scoring row with the continuations to compare; infobench prompts
become the text the speculative decoder continues; a prompt the router could not place
becomes a short draft-model row whose answer decides its task.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from specbatch.routing import (
    CHAT_ANSWER_PREFIX,
    TASKS,
    build_chat_question,
    build_fallback_prompt,
    build_infobench_prompt,
    build_scoring_prompt,
    format_mmlu_answer,
    infobench_chat_content,
    parse_mmlu,
    scoring_continuations,
)
from specbatch.routing.classify import AMBIGUOUS
from specbatch.serving.chat import ChatFormat
from specbatch.serving.messages import GENERATE, SCORE, RowOutcome
from specbatch.serving.params import PromptError

SOLVE, ROUTE = "solve", "route"
_TASK_WORD = re.compile(r"\b(" + "|".join(TASKS) + r")\b", re.IGNORECASE)
# The seed system's self-refinement prompt (seeds/000, "Optional Self-Refinement"), verbatim.
REFINE_TEMPLATE = (
    "Provide a refined answer to the question below. "
    "Output ONLY the final answer without showing your reasoning or thought process.\n\n"
    "Original question:\n{prompt}\n\nPrevious answer:\n{draft_text}\n\nRefined answer:"
)


@dataclass(frozen=True)
class PreparedPrompt:
    """One prompt ready for its stage: a graph to solve, a scoring, a generation or a routing row."""

    task: str
    kind: str
    source: str = ""
    model_prompt: str = ""
    labels: tuple[str, ...] = ()
    continuations: tuple[str, ...] = ()
    chat: ChatFormat | None = None

    def answer(self, outcome: RowOutcome) -> RowOutcome:
        """The model's raw row outcome as this prompt's answer: a scoring's best
        continuation becomes its mmlu letter."""
        if outcome.error or self.kind != SCORE:
            return outcome
        if outcome.text not in self.continuations:
            return RowOutcome.failed(
                f"scorer returned {outcome.text!r}, not one of {list(self.continuations)}"
            )
        label = self.labels[self.continuations.index(outcome.text)]
        return replace(outcome, text=format_mmlu_answer(label))


def prepare_prompt(text: str, task: str, chat: ChatFormat | None = None) -> PreparedPrompt:
    """Do the task's CPU work now; raise PromptError for text the task cannot handle.

    With `chat`, the model prompt is the user turn the instance wraps in the chat
    template: the instruction itself for infobench, and for mmlu the question, with the
    assistant's turn opened (in non-thinking mode) by the answer cue so each bare letter
    is scored after it.
    """
    try:
        if task == "graph":
            return PreparedPrompt(task=task, kind=SOLVE, source=text)
        if task == "mmlu":
            question = parse_mmlu(text)
            if chat is not None:
                return PreparedPrompt(
                    task=task,
                    kind=SCORE,
                    source=text,
                    model_prompt=build_chat_question(question),
                    labels=tuple(question.labels),
                    continuations=tuple(question.labels),
                    # scoring reads the answer at once: an empty think block, whatever was asked
                    chat=replace(chat, enable_thinking=False, assistant_prefix=CHAT_ANSWER_PREFIX),
                )
            return PreparedPrompt(
                task=task,
                kind=SCORE,
                source=text,
                model_prompt=build_scoring_prompt(question),
                labels=tuple(question.labels),
                continuations=tuple(scoring_continuations(question)),
            )
        if task == "infobench":
            if chat is not None:
                content = infobench_chat_content(text)
                return PreparedPrompt(task=task, kind=GENERATE, source=text, model_prompt=content, chat=chat)
            return PreparedPrompt(
                task=task, kind=GENERATE, source=text, model_prompt=build_infobench_prompt(text)
            )
        if task == AMBIGUOUS:
            return PreparedPrompt(
                task="", kind=ROUTE, source=text, model_prompt=build_fallback_prompt(text), chat=chat
            )
    except PromptError:
        raise
    except ValueError as exc:
        raise PromptError(f"{task} prompt: {exc}") from None
    raise PromptError(f"no handler for task {task!r}")


def refine_prompt(prepared: PreparedPrompt, first_answer: str) -> PreparedPrompt:
    """The second pass of a self-refined generation: the client's own question and the first
    answer, as the model text (the user turn with `chat`, the history and thinking mode
    kept). The source stays the client's text, so the prompt is still predicted as itself."""
    text = REFINE_TEMPLATE.format(prompt=prepared.source, draft_text=first_answer)
    return replace(prepared, model_prompt=text)


def parse_task(answer: str) -> str | None:
    """The first task name in the draft model's free-text answer to the routing prompt."""
    match = _TASK_WORD.search(answer)
    return match.group(1).lower() if match else None
