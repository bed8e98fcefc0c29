"""Per-prompt parameter validation and the [1]-or-[N] broadcast rule."""

import math

import pytest

from specbatch.serving.params import (
    PromptError,
    RequestError,
    ServingLimits,
    broadcast,
    decode_prompt,
    decode_task_override,
    sampling_params,
)

LIMITS = ServingLimits(max_tokens_cap=100, default_max_tokens=20, default_temperature=0.0)


def test_defaults_fill_what_the_client_left_out():
    params = sampling_params(LIMITS)
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (20, 0.0, 1.0, 0)
    assert params.random_seed is None, "no seed: each sampled row draws afresh"
    assert not params.ignore_eos, "a row stops at end-of-sequence unless told otherwise"
    assert sampling_params(LIMITS, ignore_eos=True).ignore_eos
    assert params.min_tokens == 0 and sampling_params(LIMITS, max_tokens=30, min_tokens=30).min_tokens == 30


def test_a_seed_of_64_bits_is_kept_as_sent():
    assert sampling_params(LIMITS, random_seed=(1 << 64) - 1).random_seed == (1 << 64) - 1
    assert sampling_params(LIMITS, random_seed=0).random_seed == 0


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"max_tokens": 0}, "positive"),
        ({"max_tokens": -3}, "positive"),
        ({"max_tokens": 101}, "cap of 100"),
        ({"temperature": -0.1}, "temperature"),
        ({"min_tokens": 21}, r"min_tokens must lie in \[0, max_tokens=20\]"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"random_seed": -1}, "random_seed"),
        ({"random_seed": 1 << 64}, "random_seed"),
    ],
)
def test_bad_values_raise_a_prompt_error_naming_the_parameter(kwargs, fragment):
    with pytest.raises(PromptError, match=fragment):
        sampling_params(LIMITS, **kwargs)


def test_broadcast_takes_one_value_or_one_per_prompt():
    assert broadcast([5], 3, "max_tokens") == [5, 5, 5]
    assert broadcast([1, 2, 3], 3, "max_tokens") == [1, 2, 3]
    assert broadcast(None, 3, "max_tokens") is None
    with pytest.raises(RequestError, match="2 values for 3 prompts"):
        broadcast([1, 2], 3, "max_tokens")


def test_prompt_decoding_refuses_empty_and_non_utf8():
    assert decode_prompt("héllo".encode()) == "héllo"
    with pytest.raises(PromptError, match="empty"):
        decode_prompt(b"  \n ")
    with pytest.raises(PromptError, match="UTF-8"):
        decode_prompt(b"ok \xff\xfe")


def test_task_override_accepts_known_tasks_and_blank():
    assert decode_task_override(b" MMLU ") == "mmlu"
    assert decode_task_override(b"") is None
    assert decode_task_override(None) is None
    with pytest.raises(PromptError, match="unknown task override 'poetry'"):
        decode_task_override("poetry")


def test_limits_refuse_a_default_above_the_cap():
    with pytest.raises(ValueError, match="default_max_tokens"):
        ServingLimits(max_tokens_cap=10, default_max_tokens=11)
