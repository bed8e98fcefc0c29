"""Qwen3's chat format: the template the tiny tokenizer carries, per-prompt chat through
intake, the scheduler's rendering, and the rendered text on the wire and at the instance."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from jinja2 import Template
from serving_helpers import over_the_wire, word_target
from transformers import AutoTokenizer

from specbatch.decoding.scoring import ChoiceScores
from specbatch.decoding.tiny import build_tiny_pair, refresh_chat_template
from specbatch.decoding.tokenizer_build import CHAT_TEMPLATE
from specbatch.scheduling.load import InstanceLoad
from specbatch.serving.chat import ChatFormat, parse_history
from specbatch.serving.instance.runner import InstanceRunner
from specbatch.serving.messages import GENERATE, RowWork, Run
from specbatch.serving.params import PromptError, ServingLimits
from specbatch.serving.scheduler.intake import RequestIntake, RoutedRequest
from specbatch.serving.scheduler.tasks import SCORE
from specbatch.serving.target_text import TargetText

MMLU = "Question:\nWhich bone is in the arm?\n\nChoices:\nA. Femur\nB. Humerus\nC. Tibia"
INFOBENCH = "Instruction: Name three colours.\nQuestion: \nGeneration:"


@pytest.fixture(scope="module")
def target(tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> TargetText:
    """The scheduler's view of a model with the tiny tokenizer and a 4096-token context."""
    directory = tmp_path_factory.mktemp("target")
    for path in tokenizer_dir.iterdir():
        shutil.copy(path, directory)
    (directory / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    return TargetText.load(str(directory))


def transformers_text(tokenizer, content: str, chat: ChatFormat) -> str:
    """The reference rendering: transformers' own chat template, then the assistant prefix."""
    messages = [{"role": role, "content": text} for role, text in chat.history]
    messages.append({"role": "user", "content": content})
    rendered = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=chat.enable_thinking
    )
    return rendered + chat.assistant_prefix


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


def test_the_model_text_puts_history_first_and_the_prefix_last(target, tokenizer):
    chat = ChatFormat(history=(("system", "S"), ("user", "u1"), ("assistant", "a1")), assistant_prefix="X(")
    text = target.model_text("u2", chat)
    assert text.startswith("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu1<|im_end|>\n")
    assert text.endswith("<|im_start|>user\nu2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nX(")
    assert text == transformers_text(tokenizer, "u2", chat)
    assert target.model_text("raw", None) == "raw"


def test_a_tokenizer_without_a_template_refuses_chat():
    with pytest.raises(PromptError, match="no chat template"):
        word_target(4096).model_text("hi", ChatFormat())
    assert word_target(4096).model_text("hi", None) == "hi", "a raw prompt needs no template"


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


def test_rendered_chat_rows_round_trip_on_the_wire_exactly(target):
    rows = [
        RowWork(
            1,
            GENERATE,
            target.model_text("hi é", ChatFormat((("system", "S"),), enable_thinking=True)),
            max_tokens=4,
        ),
        RowWork(
            2,
            SCORE,
            target.model_text("Q", ChatFormat(assistant_prefix="The answer is (")),
            choices=("A", "B"),
        ),
        RowWork(3, GENERATE, "raw", max_tokens=2),
    ]
    assert rows[0].prompt.startswith("<|im_start|>system\nS<|im_end|>\n")
    message = over_the_wire(Run(tuple(rows)))
    assert list(message.rows) == rows
    assert all("chat" not in row.to_wire() for row in rows), "the instance gets text, not a chat format"


# The chat template of make_intake's target: every turn's words, in order.
JOINED_TURNS = Template("{% for m in messages %}{{ m['content'] }} {% endfor %}")


def make_intake(template=JOINED_TURNS) -> RequestIntake:
    """Tokens are whitespace-separated words, within a 40-token context."""
    return RequestIntake(
        ServingLimits(max_tokens_cap=32, default_max_tokens=8),
        word_target(40, template),
        clock=lambda: 0.0,
    )


def receive(intake: RequestIntake, request: RoutedRequest):
    """The request's prompt records and its prompts' immediate failures (record, outcome)."""
    state, failures = intake.receive(request, None)
    return state.prompts, failures


def test_intake_turns_chat_prompts_into_user_turns_and_the_scorer_into_an_answer_cue():
    request = RoutedRequest(
        prompts=[INFOBENCH, MMLU, INFOBENCH],
        tasks=["infobench", "mmlu", "infobench"],
        chat=[True, True, False],
        enable_thinking=[True],
        chat_history=['[{"role": "system", "content": "Be brief."}]', "", ""],
    )
    records, failures = receive(make_intake(), request)
    assert failures == []
    generate, score, raw = (record.prepared for record in records)
    assert generate.model_prompt == "Name three colours."
    assert generate.chat == ChatFormat((("system", "Be brief."),), enable_thinking=True)
    assert score.kind == SCORE and score.continuations == ("A", "B", "C")
    assert score.chat == ChatFormat(enable_thinking=False, assistant_prefix="The answer is (")
    assert "Humerus" in score.model_prompt and "Answer" in score.model_prompt
    assert raw.chat is None and raw.model_prompt.endswith("Generation:")
    assert records[0].model_text == "Be brief. Name three colours. "
    assert records[1].model_text == f"{score.model_prompt} The answer is ("
    assert records[2].model_text == raw.model_prompt
    assert [record.input_tokens for record in records] == [len(r.model_text.split()) for r in records]


def test_a_chat_prompt_is_counted_as_rendered_and_history_needs_chat():
    padding = " ".join(["word"] * 30)
    request = RoutedRequest(
        prompts=[INFOBENCH, INFOBENCH],
        tasks=["infobench", "infobench"],
        max_tokens=[8],
        chat=[True, False],
        chat_history=["", '[{"role": "user", "content": "x"}]'],
    )
    records, failures = receive(make_intake(Template(padding + " {{ messages[-1]['content'] }}")), request)
    assert [record.index for record, _ in failures] == [0, 1] == [record.index for record in records]
    [(_, over_context), (_, needs_chat)] = failures
    assert "over the model context" in over_context.error
    assert needs_chat.error == "chat_history needs chat=true"


def test_the_scheduler_renders_chat_as_transformers_does(tokenizer, target):
    chat = ChatFormat(history=(("system", "S"), ("user", "u1"), ("assistant", "a1")), assistant_prefix="X(")
    for form in (chat, ChatFormat(enable_thinking=True), ChatFormat()):
        assert target.model_text("u2 é", form) == transformers_text(tokenizer, "u2 é", form)
    text = target.model_text("u2", chat)
    assert target.count(text) == len(tokenizer.encode(text, add_special_tokens=False))
    assert target.max_context == 4096


class _ScoringEngine:
    """Records the prompts the runner hands to the engine and answers with the first label."""

    loop_thread = None
    max_rows = 4

    def __init__(self, tokenizer) -> None:
        self.pair = SimpleNamespace(tokenizer=tokenizer)
        self.prompts: list[str] = []

    def snapshot(self) -> InstanceLoad:
        return InstanceLoad(blocks_total=64, blocks_free=64, block_size=16, max_rows=4)

    def submit_scoring(self, prompt, labels, on_done):
        self.prompts.append(prompt)
        on_done(ChoiceScores(best=labels[0], logprobs={}, input_tokens=len(prompt)), "")


def test_the_instance_runs_the_scheduler_s_rendered_text_unchanged(tokenizer, target):
    engine = _ScoringEngine(tokenizer)
    sent = []
    rows = [
        RowWork(
            1,
            SCORE,
            target.model_text("Q?", ChatFormat(assistant_prefix="The answer is (")),
            choices=("A", "B"),
        ),
        RowWork(2, SCORE, "Q? Answer:", choices=(" A", " B")),
    ]
    InstanceRunner(engine, "inst0", sent.append).handle(over_the_wire(Run(tuple(rows))))
    assert [m.outcome.text for m in sent] == ["A", " A"]
    assert engine.prompts == [
        "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is (",
        "Q? Answer:",
    ]
