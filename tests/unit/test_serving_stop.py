"""Stop strings (`stop_words`): parsed once per request, carried to every row, never streamed past."""

import pytest
from serving_fixtures import Inbox, make_engine, over_the_wire, tiny_pair

from specbatch.decoding import GenerationRequest
from specbatch.serving.instance.detokenize import IncrementalDetokenizer
from specbatch.serving.instance.runner import InstanceRunner
from specbatch.serving.params import RequestError, ServingLimits, decode_stop_words
from specbatch.serving.scheduler.intake import RequestIntake, RoutedRequest
from specbatch.serving.wire import GENERATE, RowWork, work_from_dict, work_to_dict

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
    intake = RequestIntake(ServingLimits(max_tokens_cap=32, default_max_tokens=8), len, 4096, lambda: 0.0)
    request = RoutedRequest(
        prompts=[PROMPT, PROMPT], tasks=["infobench"] * 2, predicted_tokens=[4], stop_words=[b"."]
    )
    _, jobs, errors = intake.admit(request, None)
    assert errors == [] and [job.sampling.stop for job in jobs] == [(".",), (".",)]


def test_stop_strings_round_trip_on_the_wire():
    rows = [
        RowWork(1, GENERATE, "a", max_tokens=4, stop=("\n\n", "END")),
        RowWork(2, GENERATE, "b", max_tokens=4),
    ]
    message = over_the_wire({"type": "run", "rows": [work_to_dict(row) for row in rows]})
    assert [work_from_dict(data) for data in message["rows"]] == rows


def test_a_row_ends_before_its_stop_string_and_never_streams_past_it(tiny_pair_dir):
    engine = make_engine(tiny_pair(tiny_pair_dir))
    full = engine.generate([GenerationRequest(PROMPT, max_new_tokens=32)], mode="target_only")[0].text
    start = next(
        i for i in range(6, len(full) - 3) if full[i : i + 3].isascii() and full[i : i + 3].isalpha()
    )
    stop = full[start : start + 3]

    inbox = Inbox()
    runner = InstanceRunner(engine, "inst0", inbox)
    row = RowWork(1, GENERATE, PROMPT, max_tokens=32, stop=(stop, "\x00never"), stream=True)
    runner.handle(over_the_wire({"type": "run", "rows": [work_to_dict(row)]}))
    [outcome] = inbox.wait_done({1})[1]

    assert outcome.text == full[: full.find(stop)] and outcome.finish_reason == "stop"
    streamed = "".join(inbox.deltas(1))
    assert outcome.text.startswith(streamed), "a delta never runs past where the final text ends"
