"""The instance's side of the scheduler connection: rows in a `Run` message become engine
rows, and `Step` and `Done` messages come back (a real engine over the tiny pair)."""

from __future__ import annotations

import json
import os
import threading

import pytest
from serving_fixtures import LONG_ROW_TOKENS, WAIT_S, Inbox, make_engine
from serving_helpers import over_the_wire, within_rounding

from specbatch.decoding import GenerationRequest
from specbatch.routing import build_scoring_prompt, parse_mmlu, scoring_continuations
from specbatch.scheduling.load import InstanceLoad
from specbatch.serving.chat import ChatFormat
from specbatch.serving.instance.runner import InstanceRunner
from specbatch.serving.messages import (
    GENERATE,
    SCORE,
    Cancel,
    Done,
    Hello,
    MessageError,
    RowOutcome,
    RowWork,
    Run,
    Step,
    decode,
)
from specbatch.serving.target_text import TargetText

INFOBENCH = "Instruction: Describe a lighthouse.\nQuestion: \nGeneration:"
OTHER = "Instruction: Name three rivers.\nQuestion: \nGeneration:"
MMLU = "Question:\nWhich organ produces insulin?\n\nChoices:\nA. Liver\nB. Pancreas\nC. Kidney"


@pytest.fixture(scope="module")
def target(tiny_pair_dir):
    """The scheduler's rendering of chat prompts for the tiny target."""
    return TargetText.load(str(tiny_pair_dir / "target"))


@pytest.fixture
def instance(tiny_pair):
    """(runner, inbox) on a fresh engine; rows still running at the end are cancelled (and
    waited for)."""
    inbox = Inbox()
    runner = InstanceRunner(make_engine(tiny_pair), "inst0", inbox)
    yield runner, inbox
    runner.cancel_all()
    runner.drain(WAIT_S)


def run(runner: InstanceRunner, *rows: RowWork) -> None:
    runner.handle(over_the_wire(Run(rows)))


def greedy(engine, prompt: str, max_tokens: int):
    return engine.generate([GenerationRequest(prompt, max_new_tokens=max_tokens)], mode="target_only")[0]


def test_hello_names_the_instance_and_reports_the_engine_load(instance):
    runner, _ = instance
    hello = over_the_wire(runner.hello("cpu"))
    assert isinstance(hello, Hello)
    assert (hello.TYPE, hello.instance, hello.device) == ("hello", "inst0", "cpu")
    assert hello.pid == os.getpid()
    assert hello.load.blocks_total == hello.load.blocks_free == 256
    assert hello.load.running == 0 and hello.load.max_rows == 64


def test_rows_stream_first_tokens_and_deltas_then_one_done_each(instance, reference, tiny_pair):
    runner, inbox = instance
    run(
        runner,
        RowWork(row=7, kind=GENERATE, prompt=INFOBENCH, max_tokens=24, stream=True),
        RowWork(row=9, kind=GENERATE, prompt=OTHER, max_tokens=10),
    )
    done = inbox.wait_done({7, 9})

    assert sorted(done) == [7, 9] and all(len(outcomes) == 1 for outcomes in done.values())
    [streamed], [plain] = done[7], done[9]
    steps = inbox.of_type("step")
    assert sorted(row for step in steps for row in step.first) == [7, 9], "one first token per row"
    assert all(isinstance(step.load, InstanceLoad) for step in steps)
    assert any(step.load.running > 0 and step.load.blocks_free < step.load.blocks_total for step in steps), (
        "a step reports the engine's own load, not defaults"
    )
    assert "".join(inbox.deltas(7)) == streamed.text and streamed.text
    assert inbox.deltas(9) == [], "a row that did not ask to stream sends no text"
    first_step_of_7 = next(i for i, step in enumerate(steps) if 7 in step.first)
    assert all(i >= first_step_of_7 for i, step in enumerate(steps) if any(r == 7 for r, _, _ in step.deltas))

    for outcome, prompt, max_tokens in ((streamed, INFOBENCH, 24), (plain, OTHER, 10)):
        expected = greedy(reference, prompt, max_tokens)
        assert outcome.text == expected.text, "greedy speculative decoding is the target's own output"
        assert outcome.num_output_tokens == expected.num_output_tokens == max_tokens
        assert outcome.num_input_tokens == len(tiny_pair.tokenizer.encode(prompt, add_special_tokens=False))
        assert (outcome.instance, outcome.finish_reason, outcome.error) == ("inst0", "length", "")
        assert outcome.total_draft_tokens > 0
        assert 0 <= outcome.total_accepted_draft_tokens <= outcome.total_draft_tokens
    assert all(m.load.running >= 0 for m in inbox.of_type("done"))


def test_a_chat_row_runs_the_scheduler_s_rendering_as_the_engine_would(instance, reference, target):
    runner, inbox = instance
    chat = ChatFormat(history=(("system", "Be brief."),), enable_thinking=False)
    rendered = target.model_text("Name a colour.", chat)
    assert rendered.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    run(runner, RowWork(row=1, kind=GENERATE, prompt=rendered, max_tokens=8))
    [outcome] = inbox.wait_done({1})[1]
    expected = greedy(reference, rendered, 8)
    assert outcome.text == expected.text
    assert outcome.num_input_tokens == expected.num_input_tokens


def test_a_row_the_engine_refuses_is_answered_at_once_and_the_others_still_run(instance, reference):
    runner, inbox = instance
    run(
        runner,
        RowWork(row=1, kind=GENERATE, prompt=INFOBENCH, max_tokens=5000),
        RowWork(row=2, kind=GENERATE, prompt=OTHER, max_tokens=6),
        RowWork(row=3, kind=SCORE, prompt=MMLU),
        RowWork(row=4, kind=GENERATE, prompt=OTHER, max_tokens=6, mode="beam"),
    )
    done = inbox.wait_done({1, 2, 3, 4})
    [over_context], [fine], [no_choices], [bad_mode] = done[1], done[2], done[3], done[4]
    assert over_context.finish_reason == "error" and "exceeds the model context" in over_context.error
    assert no_choices.finish_reason == "error" and "at least one choice" in no_choices.error
    assert bad_mode.finish_reason == "error" and "unknown mode" in bad_mode.error
    assert {o.instance for o in (over_context, no_choices, bad_mode)} == {"inst0"}
    assert fine.error == "" and fine.text == greedy(reference, OTHER, 6).text
    assert not any(row in step.first for step in inbox.of_type("step") for row in (1, 3, 4))


def test_cancel_ends_a_running_row_as_cancelled(instance):
    runner, inbox = instance
    run(runner, RowWork(row=5, kind=GENERATE, prompt=INFOBENCH, max_tokens=LONG_ROW_TOKENS))
    inbox.wait_started(5)
    runner.handle(over_the_wire(Cancel((5, 99))))  # 99: not a row here
    [outcome] = inbox.wait_done({5})[5]
    assert outcome.finish_reason == "cancelled" and outcome.instance == "inst0"
    assert 0 < outcome.num_output_tokens < LONG_ROW_TOKENS


def test_a_row_past_its_deadline_ends_without_running(instance):
    runner, inbox = instance
    run(runner, RowWork(row=6, kind=GENERATE, prompt=INFOBENCH, max_tokens=32, seconds_left=0.0))
    [outcome] = inbox.wait_done({6})[6]
    assert outcome.finish_reason == "deadline" and outcome.num_output_tokens == 0


def test_a_scoring_row_answers_one_of_its_choices(instance, reference, target):
    runner, inbox = instance
    question = parse_mmlu(MMLU)
    raw_prompt, raw_choices = build_scoring_prompt(question), tuple(scoring_continuations(question))
    chat_prompt = target.model_text("Which organ?", ChatFormat(assistant_prefix="The answer is ("))
    run(
        runner,
        RowWork(row=1, kind=SCORE, prompt=raw_prompt, choices=raw_choices),
        RowWork(row=2, kind=SCORE, prompt=chat_prompt, choices=("A", "B", "C")),
    )
    done = inbox.wait_done({1, 2})
    [raw], [chatted] = done[1], done[2]
    [expected_raw, expected_chat] = reference.score_choices(
        [raw_prompt, chat_prompt], [raw_choices, ("A", "B", "C")]
    )
    assert raw.text in raw_choices and raw.text == expected_raw.best
    assert chatted.text in ("A", "B", "C") and chatted.text == expected_chat.best
    assert {(o.instance, o.finish_reason, o.error) for o in (raw, chatted)} == {("inst0", "stop", "")}
    encode = reference.pair.tokenizer.encode
    assert raw.num_input_tokens == len(encode(raw_prompt, add_special_tokens=False)) > 0
    assert chatted.num_input_tokens == len(encode(chat_prompt, add_special_tokens=False)) > 0
    assert raw.num_output_tokens == chatted.num_output_tokens == 0, "a scoring generates nothing"


def test_unknown_messages_are_ignored(instance):
    runner, inbox = instance
    with pytest.raises(MessageError, match="unknown message type 'reboot'"):
        decode({"type": "reboot"})  # refused before it reaches the runner (the link logs it)
    load = runner.load()
    runner.handle(Step(first=(3,), deltas=(), load=load))  # not a message the scheduler sends
    runner.handle(Done(row=3, outcome=RowOutcome(), load=load))
    runner.handle(over_the_wire(Cancel((3,))))
    assert inbox.messages == []


def test_a_scoring_row_over_the_context_fails_alone(tiny_pair):
    inbox, loop_busy, go_on = Inbox(), threading.Event(), threading.Event()

    def send(message):
        inbox(message)
        if isinstance(message, Step) and not go_on.is_set():
            loop_busy.set()  # hold the engine's loop inside its step callback
            go_on.wait(WAIT_S)

    runner = InstanceRunner(make_engine(tiny_pair), "inst0", send)
    try:
        run(runner, RowWork(row=1, kind=GENERATE, prompt=INFOBENCH, max_tokens=LONG_ROW_TOKENS))
        assert loop_busy.wait(WAIT_S)
        question = parse_mmlu(MMLU)
        prompt, choices = build_scoring_prompt(question), tuple(scoring_continuations(question))
        run(  # both reach the engine's next iteration together
            runner,
            RowWork(row=2, kind=SCORE, prompt="word " * 5000, choices=choices),
            RowWork(row=3, kind=SCORE, prompt=prompt, choices=choices),
        )
        go_on.set()
        done = inbox.wait_done({2, 3})
        [too_long], [fine] = done[2], done[3]
        assert too_long.finish_reason == "error" and "context" in too_long.error
        assert fine.error == "" and fine.text in choices
    finally:
        go_on.set()
        runner.cancel_all()
        runner.drain(WAIT_S)  # the engine's thread must not be inside a step when the process exits


def test_a_row_ends_before_its_stop_string_and_never_streams_past_it(instance, reference):
    runner, inbox = instance
    full = reference.generate([GenerationRequest(INFOBENCH, max_new_tokens=32)], mode="target_only")[0].text
    start = next(
        i for i in range(6, len(full) - 3) if full[i : i + 3].isascii() and full[i : i + 3].isalpha()
    )
    stop = full[start : start + 3]

    row = RowWork(1, GENERATE, INFOBENCH, max_tokens=32, stop=(stop, "\x00never"), stream=True)
    runner.handle(over_the_wire(Run((row,))))
    [outcome] = inbox.wait_done({1})[1]

    assert outcome.text == full[: full.find(stop)] and outcome.finish_reason == "stop"
    streamed = "".join(inbox.deltas(1))
    assert outcome.text.startswith(streamed), "a delta never runs past where the final text ends"


def test_a_row_reports_its_logprobs_and_a_row_whose_report_fails_still_gets_one_done(instance, reference):
    runner, inbox = instance
    run(runner, RowWork(row=1, kind=GENERATE, prompt=OTHER, max_tokens=6, logprobs=2))
    [reported] = inbox.wait_done({1})[1]
    entries = json.loads(reported.logprobs)
    assert [e["id"] for e in entries] == greedy(reference, OTHER, 6).tokens
    assert all(len(e["top_logprobs"]) == 2 and e["token"] for e in entries)

    def broken(token: int) -> str:
        raise RuntimeError("no text for this token")

    runner._token_text = broken
    run(
        runner,
        RowWork(row=2, kind=GENERATE, prompt=OTHER, max_tokens=6, logprobs=2),
        RowWork(row=3, kind=GENERATE, prompt=INFOBENCH, max_tokens=6),
    )
    done = inbox.wait_done({2, 3})
    [failed], [fine] = done[2], done[3]
    assert failed.finish_reason == "error" and "no text for this token" in failed.error
    assert fine.error == "" and fine.logprobs == "" and fine.text == greedy(reference, INFOBENCH, 6).text


def test_a_streamed_row_sends_each_delta_with_its_tokens_logprobs_the_rest_at_its_end(instance, reference):
    runner, inbox = instance
    run(
        runner,
        RowWork(row=1, kind=GENERATE, prompt=INFOBENCH, max_tokens=16, logprobs=1, stream=True),
        RowWork(row=2, kind=GENERATE, prompt=INFOBENCH, max_tokens=16, logprobs=1),
    )
    done = inbox.wait_done({1, 2})
    [streamed], [whole] = done[1], done[2]
    pieces = inbox.delta_logprobs(1)
    assert len(pieces) == len(inbox.deltas(1)) > 1 and all(pieces), "every delta carries its tokens'"
    sent = [entry for piece in [*pieces, streamed.logprobs] for entry in json.loads(piece)]
    assert within_rounding(sent, json.loads(whole.logprobs)), "the deltas and the report add up to the whole"
    assert [e["id"] for e in sent] == greedy(reference, INFOBENCH, 16).tokens
