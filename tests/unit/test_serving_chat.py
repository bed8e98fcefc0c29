"""Qwen3's chat format: the template the tiny tokenizer carries, per-prompt chat through
admission, the wire and the instance's rendering."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from specbatch.decoding.tiny import build_tiny_pair, refresh_chat_template
from specbatch.decoding.tokenizer_build import CHAT_TEMPLATE, build_tokenizer
from specbatch.serving.chat import ChatFormat, model_prompt, parse_history, render_chat
from specbatch.serving.instance.runner import InstanceRunner
from specbatch.serving.params import PromptError, ServingLimits
from specbatch.serving.scheduler.intake import RequestIntake, RoutedRequest
from specbatch.serving.scheduler.tasks import SCORE
from specbatch.serving.scheduler.tokens import load_token_counter
from specbatch.serving.wire import (
    GENERATE,
    RowWork,
    decode,
    encode,
    outcome_from_dict,
    work_from_dict,
    work_to_dict,
)

MMLU = "Question:\nWhich bone is in the arm?\n\nChoices:\nA. Femur\nB. Humerus\nC. Tibia"
INFOBENCH = "Instruction: Name three colours.\nQuestion: \nGeneration:"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def test_the_tiny_tokenizer_renders_qwen3_non_thinking_and_thinking_modes(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    off = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert off == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    on = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert on.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    # an earlier assistant turn loses its reasoning, as in Qwen3's own template
    turns = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nb"},
        {"role": "user", "content": "c"},
    ]
    assert "hmm" not in tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)


def test_an_old_build_gets_the_current_template_once(tokenizer_dir: Path, tmp_path: Path):
    old = AutoTokenizer.from_pretrained(tokenizer_dir)
    old.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    old.save_pretrained(tmp_path)
    assert refresh_chat_template(tmp_path) is True
    assert AutoTokenizer.from_pretrained(tmp_path).chat_template == CHAT_TEMPLATE
    assert refresh_chat_template(tmp_path) is False


def test_reusing_an_old_build_refreshes_both_tokenizers(tokenizer_dir: Path, tmp_path: Path):
    old = AutoTokenizer.from_pretrained(tokenizer_dir)
    old.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    for name in ("target", "draft"):
        old.save_pretrained(tmp_path / name)
        (tmp_path / name / "config.json").write_text("{}")
    (tmp_path / "controlled.json").write_text("{}")
    assert build_tiny_pair(tmp_path) == (tmp_path / "target", tmp_path / "draft")
    for name in ("target", "draft"):
        assert AutoTokenizer.from_pretrained(tmp_path / name).chat_template == CHAT_TEMPLATE


def test_render_chat_puts_history_first_and_the_prefix_last(tokenizer):
    chat = ChatFormat(history=(("system", "S"), ("user", "u1"), ("assistant", "a1")), assistant_prefix="X(")
    text = render_chat(tokenizer, "u2", chat)
    assert text.startswith("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu1<|im_end|>\n")
    assert text.endswith("<|im_start|>user\nu2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nX(")
    assert model_prompt(tokenizer, "raw", None) == "raw"


def test_a_tokenizer_without_a_template_refuses_chat():
    class Plain:
        chat_template = None

    with pytest.raises(PromptError, match="no chat template"):
        render_chat(Plain(), "hi", ChatFormat())


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{", "not JSON"),
        ('{"role": "user"}', "JSON list"),
        ('[{"role": "tool", "content": "x"}]', r"chat_history\[0\]"),
        ('[{"role": "user", "content": "x"}, {"role": "system", "content": "y"}]', "only come first"),
    ],
)
def test_bad_history_is_a_prompt_error(raw: str, message: str):
    with pytest.raises(PromptError, match=message):
        parse_history(raw)


def test_history_round_trips_through_json():
    chat = ChatFormat(history=(("system", "S"), ("user", "é")))
    assert parse_history(chat.history_json()) == chat.history
    assert parse_history("") == () and parse_history(None) == ()


def test_chat_rows_round_trip_on_the_wire_and_plain_rows_carry_none():
    rows = [
        RowWork(1, GENERATE, "hi", max_tokens=4, chat=ChatFormat((("system", "S"),), enable_thinking=True)),
        RowWork(2, SCORE, "Q", choices=("A", "B"), chat=ChatFormat(assistant_prefix="The answer is (")),
        RowWork(3, GENERATE, "raw", max_tokens=2),
    ]
    message = decode(encode({"type": "run", "rows": [work_to_dict(row) for row in rows]})[4:])
    assert [work_from_dict(data) for data in message["rows"]] == rows
    assert message["rows"][2]["chat"] is None


def make_intake(render=None) -> RequestIntake:
    return RequestIntake(
        ServingLimits(max_tokens_cap=32, default_max_tokens=8),
        lambda text: len(text.split()),
        max_context=40,
        clock=lambda: 0.0,
        render_chat=render,
    )


def admit(intake: RequestIntake, request: RoutedRequest):
    """The request's jobs and its prompts' immediate errors."""
    _, jobs, errors = intake.admit(request, None)
    return jobs, errors


def test_admission_turns_chat_prompts_into_user_turns_and_the_scorer_into_an_answer_cue():
    request = RoutedRequest(
        prompts=[INFOBENCH, MMLU, INFOBENCH],
        tasks=["infobench", "mmlu", "infobench"],
        predicted_tokens=[4],
        chat=[True, True, False],
        enable_thinking=[True],
        chat_history=['[{"role": "system", "content": "Be brief."}]', "", ""],
    )
    jobs, _ = admit(make_intake(), request)
    generate, score, raw = (job.prepared for job in jobs)
    assert generate.model_prompt == "Name three colours."
    assert generate.chat == ChatFormat((("system", "Be brief."),), enable_thinking=True)
    assert score.kind == SCORE and score.continuations == ("A", "B", "C")
    assert score.chat == ChatFormat(enable_thinking=False, assistant_prefix="The answer is (")
    assert "Humerus" in score.model_prompt and "Answer" in score.model_prompt
    assert raw.chat is None and raw.model_prompt.endswith("Generation:")


def test_a_chat_prompt_is_counted_as_rendered_and_history_needs_chat():
    padding = " ".join(["word"] * 30)
    request = RoutedRequest(
        prompts=[INFOBENCH, INFOBENCH],
        tasks=["infobench", "infobench"],
        predicted_tokens=[4],
        max_tokens=[8],
        chat=[True, False],
        chat_history=["", '[{"role": "user", "content": "x"}]'],
    )
    jobs, errors = admit(make_intake(render=lambda content, chat: f"{padding} {content}"), request)
    assert jobs == []
    assert [index for index, _ in errors] == [0, 1]
    [(_, over_context), (_, needs_chat)] = errors
    assert "over the model context" in over_context.error
    assert needs_chat.error == "chat_history needs chat=true"


def test_the_scheduler_renders_chat_as_the_instance_does(tiny_pair_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_pair_dir / "target")
    count_tokens, max_context, render = load_token_counter(str(tiny_pair_dir / "target"))
    chat = ChatFormat(history=(("system", "S"), ("user", "u1"), ("assistant", "a1")), assistant_prefix="X(")
    for form in (chat, ChatFormat(enable_thinking=True), ChatFormat()):
        assert render("u2 é", form) == render_chat(tokenizer, "u2 é", form)
    text = render_chat(tokenizer, "u2", chat)
    assert count_tokens(text) == len(tokenizer.encode(text, add_special_tokens=False))
    assert max_context == 4096


class _ScoringEngine:
    """Records the prompts the runner hands to the engine and answers with the first label."""

    loop_thread = None
    max_rows = 4

    def __init__(self, tokenizer) -> None:
        self.pair = SimpleNamespace(tokenizer=tokenizer)
        self.prompts: list[str] = []

    def snapshot(self):
        return SimpleNamespace(
            running=0,
            waiting=0,
            blocks_total=64,
            blocks_free=64,
            block_size=16,
            step_seconds=0.0,
            seconds_per_token=0.0,
            lookahead=0,
            preemptions=0,
        )

    def submit_scoring(self, prompt, labels, on_done):
        self.prompts.append(prompt)
        on_done(SimpleNamespace(best=labels[0]), "")


def test_the_instance_renders_chat_rows_before_the_engine_sees_them(tokenizer):
    engine = _ScoringEngine(tokenizer)
    sent = []
    rows = [
        RowWork(1, SCORE, "Q?", choices=("A", "B"), chat=ChatFormat(assistant_prefix="The answer is (")),
        RowWork(2, SCORE, "Q? Answer:", choices=(" A", " B")),
    ]
    InstanceRunner(engine, "inst0", sent.append).handle(
        {"type": "run", "rows": [work_to_dict(row) for row in rows]}
    )
    assert [outcome_from_dict(m["outcome"]).text for m in sent] == ["A", " A"]
    assert engine.prompts == [
        "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is (",
        "Q? Answer:",
    ]
