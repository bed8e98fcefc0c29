"""The scheduler↔worker tensors and the ensemble outputs round-trip exactly."""

import numpy as np

from specbatch.serving.dispatcher import BatchResult
from specbatch.serving.outcomes import PromptOutcome
from specbatch.serving.protocol import (
    batch_result_from_arrays,
    outcome_arrays,
    outcomes_from_arrays,
    work_arrays,
    work_from_arrays,
    worker_result_arrays,
)
from specbatch.serving.worker import WorkerResult, WorkItem


def test_work_items_round_trip():
    items = [
        WorkItem("Instruction: héllo\nGeneration:", 16, 0.75, 0.5, 40),
        WorkItem("Question: x\nAnswer:", 1, continuations=(" A", " B")),
    ]
    mode, back = work_from_arrays(work_arrays("score", items))
    assert mode == "score"
    assert back == items


def test_outcomes_round_trip_with_counters_and_rate():
    outcomes = [
        PromptOutcome("ünïcode", "infobench", "length", 5, 8, 10, 7),
        PromptOutcome.failed("prompt is empty"),
    ]
    arrays = outcome_arrays(outcomes)
    assert arrays["num_output_tokens"].dtype == np.uint32
    assert arrays["acceptance_rate"].tolist() == [np.float32(0.7), 0.0]
    assert outcomes_from_arrays(arrays) == outcomes


def test_worker_result_carries_measurements():
    result = WorkerResult(
        [PromptOutcome("a", num_output_tokens=3)], seconds_per_token=0.25, free_kv_tokens=1234
    )
    back = batch_result_from_arrays(worker_result_arrays(result))
    assert back == BatchResult([PromptOutcome("a", num_output_tokens=3)], 0.25, 1234)
