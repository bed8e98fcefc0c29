"""The client's request-wide list options as the ensemble's inputs, and their CLI flags."""

from __future__ import annotations

import numpy as np
import pytest
from specbatch_client import GenerationOptions
from specbatch_client.cli import parse_logit_bias


def test_list_options_become_the_ensemble_inputs_of_their_names():
    options = GenerationOptions(stop=("\n\n", "END"), stop_token_ids=[7, 9], logit_bias={5: -100, 12: 2.5})
    assert options.list_inputs() == {
        "stop_words": (["\n\n", "END"], np.object_),
        "stop_token_ids": ([7, 9], np.int32),
        "logit_bias_ids": ([5, 12], np.int32),
        "logit_bias_values": ([-100.0, 2.5], np.float32),
    }


def test_absent_or_empty_list_options_send_nothing():
    assert GenerationOptions().list_inputs() == {}
    assert GenerationOptions(stop=[], stop_token_ids=(), logit_bias={}).list_inputs() == {}


def test_logit_bias_flag_reads_id_equals_value():
    assert parse_logit_bias("151643=-100") == (151643, -100.0)
    for text in ("151643", "x=1", "1=high"):
        with pytest.raises(Exception, match="ID=VALUE"):
            parse_logit_bias(text)
