"""qwen3_specdec called directly: a request's arrays become rows, run on the same runner,
and come back as arrays in row order."""

import json

import numpy as np
from serving_fixtures import make_engine

from specbatch.decoding import GenerationRequest
from specbatch.serving.instance.direct import direct_arrays, rows_from_arrays, run_rows
from specbatch.serving.instance.runner import InstanceRunner
from specbatch.serving.messages import GENERATE, SCORE, RowOutcome, RowWork
from specbatch.triton.strings import strings, texts

PROMPTS = ["Instruction: Describe a lighthouse.\nQuestion: \nGeneration:", "Name three rivers."]


def test_generation_arrays_become_rows_with_greedy_defaults():
    arrays = {
        "mode": strings(["target_only"]),
        "prompt": strings(PROMPTS),
        "max_tokens": np.array([[8], [4]], dtype=np.int32),
        "stop": strings([json.dumps(["\n\n"]), json.dumps([])]),
    }
    assert rows_from_arrays(arrays, first_row=10) == [
        RowWork(10, GENERATE, PROMPTS[0], mode="target_only", max_tokens=8, stop=("\n\n",)),
        RowWork(11, GENERATE, PROMPTS[1], mode="target_only", max_tokens=4),
    ]


def test_score_mode_makes_scoring_rows_with_their_choices():
    arrays = {
        "mode": strings(["score"]),
        "prompt": strings(["Q? Answer:"]),
        "choices": strings([json.dumps([" A", " B"])]),
        "temperature": np.array([0.5], dtype=np.float32),
    }
    [row] = rows_from_arrays(arrays, first_row=0)
    assert (row.kind, row.mode, row.choices, row.temperature) == (SCORE, "speculative", (" A", " B"), 0.5)


def test_direct_arrays_hold_text_reasons_errors_and_counters():
    arrays = direct_arrays([RowOutcome("a", "", "length", 3, 4, 6, 5), RowOutcome.failed("too long")])
    assert set(arrays) == {
        "text_output",
        "finish_reason",
        "error",
        "num_input_tokens",
        "num_output_tokens",
        "total_draft_tokens",
        "total_accepted_draft_tokens",
    }, "the outputs qwen3_specdec declares, nothing of the ensemble's"
    assert texts(arrays["text_output"]) == ["a", ""]
    assert texts(arrays["finish_reason"]) == ["length", "error"]
    assert texts(arrays["error"]) == ["", "too long"]
    assert arrays["total_accepted_draft_tokens"].dtype == np.uint32
    assert arrays["num_output_tokens"].tolist() == [4, 0]


def test_run_rows_waits_for_every_row_and_answers_in_row_order(tiny_pair):
    engine = make_engine(tiny_pair)
    rows = [
        RowWork(3, GENERATE, PROMPTS[0], max_tokens=12),
        RowWork(4, GENERATE, PROMPTS[1], max_tokens=5000),
        RowWork(5, GENERATE, PROMPTS[1], max_tokens=4),
    ]
    outcomes = run_rows(lambda send: InstanceRunner(engine, "direct", send), rows)
    expected = engine.generate(
        [GenerationRequest(PROMPTS[0], max_new_tokens=12), GenerationRequest(PROMPTS[1], max_new_tokens=4)],
        mode="target_only",
    )
    assert [o.text for o in outcomes] == [expected[0].text, "", expected[1].text]
    assert "context" in outcomes[1].error
    assert run_rows(lambda send: InstanceRunner(engine, "direct", send), []) == []


def test_run_rows_answers_each_request_as_soon_as_its_own_rows_are_done(tiny_pair):
    engine = make_engine(tiny_pair)
    rows = [
        RowWork(0, GENERATE, PROMPTS[0], max_tokens=40),
        RowWork(1, GENERATE, PROMPTS[1], max_tokens=2),
        RowWork(2, GENERATE, PROMPTS[1], max_tokens=3),
    ]
    answered: list[tuple[int, list[str]]] = []
    outcomes = run_rows(
        lambda send: InstanceRunner(engine, "direct", send),
        rows,
        [0, 1, 1],
        lambda owner, mine: answered.append((owner, [o.text for o in mine])),
    )
    assert [owner for owner, _ in answered] == [1, 0], "the short request does not wait for the long one"
    assert answered[0][1] == [outcomes[1].text, outcomes[2].text]
    assert answered[1][1] == [outcomes[0].text]
