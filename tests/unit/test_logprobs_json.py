"""The log-probabilities' JSON: written once by the instance, joined unread by the scheduler."""

from __future__ import annotations

import json

from specbatch.logprobs import LOWEST_LOGPROB, TokenLogprob, join_json, to_json

TEXTS = {1: "a", 2: "b", 3: "c"}.__getitem__


def test_joined_lists_are_the_list_of_every_entry_in_order():
    first = to_json([TokenLogprob(1, -0.5, ((2, -1.0),))], TEXTS)
    parts = [first, "[]", to_json([TokenLogprob(3, -2.0)], TEXTS)]
    assert json.loads(join_json(parts)) == [
        {"id": 1, "token": "a", "logprob": -0.5, "top_logprobs": [{"id": 2, "token": "b", "logprob": -1.0}]},
        {"id": 3, "token": "c", "logprob": -2.0, "top_logprobs": []},
    ]


def test_a_row_reporting_none_joins_to_none_and_empty_lists_to_an_empty_one():
    assert join_json([]) == join_json(["", ""]) == ""
    assert join_json(["[]", ""]) == "[]"


def test_an_impossible_token_reads_the_floor_json_can_hold():
    [entry] = json.loads(to_json([TokenLogprob(1, float("-inf"))], TEXTS))
    assert entry["logprob"] == LOWEST_LOGPROB
