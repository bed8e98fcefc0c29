"""Stop strings (`stop_words`): parsed once per request, carried to every row, never streamed past."""

import pytest
from serving_helpers import over_the_wire, word_target

from specbatch.serving.instance.detokenize import IncrementalDetokenizer
from specbatch.serving.messages import GENERATE, RowWork, Run
from specbatch.serving.params import RequestError, ServingLimits, decode_stop_words
from specbatch.serving.scheduler.intake import RequestIntake, RoutedRequest

PROMPT = "Instruction: Name three colours.\nQuestion: \nGeneration:"


def characters(ids):
    """A decoder where token i is the character chr(i)."""
    return "".join(chr(i) for i in ids)


def stream(text: str, stop: tuple[str, ...], final: str) -> list[str]:
    detok = IncrementalDetokenizer(characters, stop)
    pieces = [detok.push([ord(c)]) for c in text]
    return [*pieces, detok.finish(final)]


def test_a_possible_stop_prefix_is_held_back_and_dropped_when_the_stop_completes():
    pieces = stream("ab END", ("END",), final="ab ")
    assert "".join(pieces) == "ab "
    assert pieces[:3] == ["a", "b", " "] and pieces[3:5] == ["", ""], "'E' and 'EN' could start END"


def test_held_text_that_did_not_become_a_stop_is_released():
    pieces = stream("xEy", ("EN",), final="xEy")
    assert pieces == ["x", "", "Ey", ""]
    assert stream("xE", ("EN",), final="xE") == ["x", "", "E"], "finish releases what the text keeps"


def test_without_stop_strings_nothing_is_held():
    assert stream("abc", (), final="abc") == ["a", "b", "c", ""]


def test_stop_words_are_decoded_and_bounded():
    assert decode_stop_words([b"\n\n", "", "END"]) == ("\n\n", "END")
    assert decode_stop_words(None) == ()
    with pytest.raises(RequestError, match="at most"):
        decode_stop_words(["x"] * 17)


def test_every_generated_prompt_of_the_request_gets_the_stop_strings():
    intake = RequestIntake(
        ServingLimits(max_tokens_cap=32, default_max_tokens=8), word_target(4096), lambda: 0.0
    )
    request = RoutedRequest(prompts=[PROMPT, PROMPT], tasks=["infobench"] * 2, stop_words=[b"."])
    state, failures = intake.receive(request, None)
    assert failures == [] and [record.sampling.stop for record in state.prompts] == [(".",), (".",)]


def test_stop_strings_stop_tokens_and_logprobs_round_trip_on_the_wire():
    rows = [
        RowWork(1, GENERATE, "a", max_tokens=4, stop=("\n\n", "END")),
        RowWork(2, GENERATE, "b", max_tokens=4),
        RowWork(3, GENERATE, "c", max_tokens=4, stop_token_ids=(7, 151645), logprobs=5),
        RowWork(4, GENERATE, "d", max_tokens=4, logit_bias=((9, -100.0), (11, 2.5)), min_p=0.1),
    ]
    message = over_the_wire(Run(tuple(rows)))
    assert list(message.rows) == rows
