"""Stop rules keep a row's log-probabilities beside the tokens it keeps."""

from __future__ import annotations

from specbatch.decoding.stopping import RowOutput, StopRules
from specbatch.logprobs import TokenLogprob

EOS = 0


def characters(ids: list[int]) -> str:
    """A decoder where token i is the character chr(i) (the EOS decodes to nothing)."""
    return "".join(chr(i) for i in ids if i != EOS)


def logprobs_of(tokens: list[int]) -> list[TokenLogprob]:
    return [TokenLogprob(t, -float(t), ((t, -float(t)),)) for t in tokens]


def kept_logprobs(output: RowOutput, *steps: list[int]) -> list[TokenLogprob]:
    rules = StopRules({EOS}, characters)
    for step in steps:
        rules.extend(output, step, logprobs_of(step))
        if output.finish_reason:
            break
    assert [lp.token for lp in output.logprobs] == output.tokens
    return output.logprobs


def test_an_end_of_sequence_keeps_the_logprobs_up_to_it():
    output = RowOutput(max_new_tokens=10, stop=(), logprobs=[])
    kept = kept_logprobs(output, [97, 98], [99, EOS, 100, 101])
    assert output.finish_reason == "stop" and [lp.token for lp in kept] == [97, 98, 99, EOS]


def test_a_stop_string_cuts_the_logprobs_where_it_cuts_the_tokens():
    output = RowOutput(max_new_tokens=10, stop=("cd",), logprobs=[])
    kept = kept_logprobs(output, [97, 98], [99, 100, 101, 102])
    assert (output.finish_reason, output.text) == ("stop", "ab")
    assert [lp.token for lp in kept] == [97, 98, 99, 100], "up to the token that completed the stop"


def test_the_token_budget_cuts_the_logprobs_and_a_row_that_did_not_ask_keeps_none():
    output = RowOutput(max_new_tokens=3, stop=(), logprobs=[])
    assert len(kept_logprobs(output, [97, 98], [99, 100])) == 3
    silent = RowOutput(max_new_tokens=3, stop=())
    StopRules({EOS}, characters).extend(silent, [97], logprobs_of([97]))
    assert silent.logprobs is None and silent.tokens == [97]


def test_a_stop_token_ends_the_row_even_where_it_ignores_end_of_sequence_but_not_before_min_tokens():
    stops = frozenset({99})
    output = RowOutput(max_new_tokens=10, stop=(), ignore_eos=True, stop_token_ids=stops, logprobs=[])
    kept = kept_logprobs(output, [97, EOS], [99, 100])
    assert output.finish_reason == "stop" and [lp.token for lp in kept] == [97, EOS, 99]
    held = RowOutput(max_new_tokens=10, stop=(), stop_token_ids=stops, min_tokens=2, logprobs=[])
    assert [lp.token for lp in kept_logprobs(held, [99, 98], [99, 100])] == [99, 98, 99]


def test_a_row_that_includes_its_stop_string_ends_right_after_the_first_one():
    rules = StopRules({EOS}, characters)
    included = RowOutput(max_new_tokens=10, stop=("xyz", "cd", "c"), include_stop_str=True)
    rules.extend(included, [97, 98, 99, 100, 101])
    assert (included.finish_reason, included.text) == ("stop", "abc"), "the first to start, the first listed"
    later = RowOutput(max_new_tokens=10, stop=("de", "bcd"), include_stop_str=True)
    for step in ([97, 98], [99, 100, 101]):
        rules.extend(later, step)
    assert later.text == "abcd" and later.tokens == [97, 98, 99, 100]
    cut = RowOutput(max_new_tokens=10, stop=("bcd",))
    for step in ([97, 98], [99, 100, 101]):
        rules.extend(cut, step)
    assert cut.text == "a" and cut.tokens == later.tokens, "the same tokens, the text cut before it"
