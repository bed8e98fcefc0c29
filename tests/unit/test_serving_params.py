"""Per-prompt parameter validation and the [1]-or-[N] broadcast rule."""

import math

import pytest

from specbatch.serving.params import (
    PromptError,
    RequestError,
    ServingLimits,
    broadcast,
    decode_logit_bias,
    decode_prompt,
    decode_stop_token_ids,
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
    assert not params.include_stop_str_in_output, "the text ends right before a stop string unless told"
    assert sampling_params(LIMITS, include_stop_str_in_output=True).include_stop_str_in_output
    assert params.min_tokens == 0 and sampling_params(LIMITS, max_tokens=30, min_tokens=30).min_tokens == 30
    assert params.logprobs is None, "no log-probabilities unless asked"
    penalties = (params.presence_penalty, params.frequency_penalty, params.repetition_penalty)
    assert penalties == (0.0, 0.0, 1.0), "no penalties unless asked"
    assert params.min_p == 0.0 and sampling_params(LIMITS, min_p=0.1).min_p == 0.1
    assert [sampling_params(LIMITS, logprobs=n).logprobs for n in (-1, 0, 20)] == [None, 0, 20]


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
        ({"logprobs": 21}, r"logprobs must lie in \[0, 20\]"),
        ({"presence_penalty": 2.5}, r"presence_penalty must lie in \[-2, 2\]"),
        ({"min_p": 1.5}, r"min_p must lie in \[0, 1\]"),
        ({"frequency_penalty": math.inf}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be a number > 0"),
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


def test_stop_token_ids_are_kept_in_order_and_bounded():
    assert decode_stop_token_ids(None) == () and decode_stop_token_ids([9, 3]) == (9, 3)
    for bad in ([-1], list(range(17))):
        with pytest.raises(RequestError, match="stop_token_ids"):
            decode_stop_token_ids(bad)


def test_a_logit_bias_pairs_each_id_with_its_value_and_is_bounded():
    assert decode_logit_bias(None, None) == ()
    assert decode_logit_bias([9, 3], [1.0, -100.0]) == ((9, 1.0), (3, -100.0))
    for ids, values in (([1, 2], [1.0]), ([-1], [1.0]), ([1], [100.5]), (list(range(301)), [0.0] * 301)):
        with pytest.raises(RequestError, match="logit_bias"):
            decode_logit_bias(ids, values)
