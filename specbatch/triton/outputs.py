"""The output tensors of the ensemble and of qwen3_specdec as numpy arrays, free of
Triton's Python API: the adapters only wrap them in pb_utils tensors, so the packing is
tested without a server.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specbatch.serving.messages import RowOutcome
from specbatch.triton.strings import strings

COUNTERS = ("num_input_tokens", "num_output_tokens", "total_draft_tokens", "total_accepted_draft_tokens")
# What qwen3_specdec answers when it is called directly (Triton's own batcher, the baseline).
DIRECT_OUTPUTS = ("text_output", "finish_reason", "error", *COUNTERS)


def outcome_arrays(
    outcomes: Sequence[RowOutcome], indices: Sequence[int] | None = None, with_text: bool = True
) -> dict[str, np.ndarray]:
    """Prompts in input order, or the prompts at `indices`; `model_instance` names the
    instance that ran each (empty for prompts answered without a model).

    A streaming request's final response leaves the text out (`with_text=False`): it
    already went out as deltas.
    """
    indices = range(len(outcomes)) if indices is None else indices
    arrays = {
        "text_output": strings([o.text if with_text else "" for o in outcomes]),
        "index": np.array(indices, dtype=np.uint32),
        "task": strings([o.task for o in outcomes]),
        "finish_reason": strings([o.finish_reason for o in outcomes]),
        "error": strings([o.error for o in outcomes]),
        "acceptance_rate": np.array([o.acceptance_rate for o in outcomes], dtype=np.float32),
        "model_instance": strings([o.instance for o in outcomes]),
        "token_logprobs": strings([o.logprobs for o in outcomes]),
    }
    for name in COUNTERS:
        arrays[name] = np.array([getattr(o, name) for o in outcomes], dtype=np.uint32)
    return arrays


def delta_arrays(index: int, task: str, text: str, logprobs: str = "") -> dict[str, np.ndarray]:
    """One streaming delta of prompt `index`, with every ensemble output present: its
    `token_logprobs` are those of the tokens whose text it carries."""
    outcome = RowOutcome(text=text, task=task, finish_reason="", logprobs=logprobs)
    return outcome_arrays([outcome], indices=[index])
