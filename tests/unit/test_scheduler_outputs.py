"""The ensemble's output arrays: one entry per prompt in input order, exact dtypes."""

import numpy as np
import pytest

from specbatch.serving.messages import RowOutcome
from specbatch.triton.outputs import delta_arrays, outcome_arrays
from specbatch.triton.strings import texts

OUTCOMES = [
    RowOutcome("ünïcode", "infobench", "length", 5, 8, 10, 7, instance="specdec_1"),
    RowOutcome("submit_paths(paths=[[0, 1]], weights=[4])", "graph"),
    RowOutcome.failed("prompt is empty"),
]


def test_outcomes_become_arrays_with_counters_rate_and_instance():
    arrays = outcome_arrays(OUTCOMES)
    assert texts(arrays["text_output"]) == [o.text for o in OUTCOMES]
    assert arrays["index"].tolist() == [0, 1, 2] and arrays["index"].dtype == np.uint32
    assert texts(arrays["task"]) == ["infobench", "graph", ""]
    assert texts(arrays["finish_reason"]) == ["length", "stop", "error"]
    assert texts(arrays["error"]) == ["", "", "prompt is empty"]
    assert texts(arrays["model_instance"]) == ["specdec_1", "", ""], "empty for prompts no model ran"
    assert arrays["acceptance_rate"].dtype == np.float32
    assert arrays["acceptance_rate"].tolist() == [pytest.approx(0.7), 0.0, 0.0]
    for name, values in {
        "num_input_tokens": [5, 0, 0],
        "num_output_tokens": [8, 0, 0],
        "total_draft_tokens": [10, 0, 0],
        "total_accepted_draft_tokens": [7, 0, 0],
    }.items():
        assert arrays[name].dtype == np.uint32 and arrays[name].tolist() == values


def test_a_streamed_request_s_final_response_leaves_the_text_out():
    arrays = outcome_arrays(OUTCOMES[:2], indices=[3, 5], with_text=False)
    assert texts(arrays["text_output"]) == ["", ""]
    assert arrays["index"].tolist() == [3, 5]
    assert arrays["num_output_tokens"].tolist() == [8, 0]


def test_a_delta_carries_every_output_for_its_prompt():
    arrays = delta_arrays(2, "infobench", "Hel")
    assert arrays.keys() == outcome_arrays(OUTCOMES).keys()
    assert texts(arrays["text_output"]) == ["Hel"] and arrays["index"].tolist() == [2]
    assert texts(arrays["task"]) == ["infobench"] and texts(arrays["finish_reason"]) == [""]
