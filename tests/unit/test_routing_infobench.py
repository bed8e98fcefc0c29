"""Open-instruction prompts: both renderings, the raw completion frame, the hint and the chat template."""

from __future__ import annotations

import pytest

from specbatch.routing import RoutingError, build_infobench_prompt, parse_infobench

REQUEST = "Instruction: Translate the sentence into French.\nQuestion: The train leaves at noon.\nGeneration:"
REQUEST_EMPTY_INPUT = "Instruction: Write a haiku about snow.\nQuestion: \nGeneration:"
DATASET = "Translate the sentence into French.\n\nThe train leaves at noon."
DATASET_NO_INPUT = "Write a haiku about snow."

# The layout of Qwen3's chat template for one user turn with enable_thinking=False.
QWEN3_LIKE_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}"
)


def test_parse_both_renderings():
    request = parse_infobench(REQUEST)
    dataset = parse_infobench(DATASET)
    assert (request.instruction, request.input, request.rendering) == (
        "Translate the sentence into French.",
        "The train leaves at noon.",
        "request",
    )
    assert (dataset.instruction, dataset.input, dataset.rendering) == (
        "Translate the sentence into French.",
        "The train leaves at noon.",
        "dataset",
    )
    assert parse_infobench(DATASET_NO_INPUT).input == ""
    assert parse_infobench(REQUEST_EMPTY_INPUT).input == ""


@pytest.mark.parametrize("prompt", [REQUEST, REQUEST_EMPTY_INPUT])
def test_request_rendering_is_already_the_raw_completion_prompt(prompt: str):
    assert build_infobench_prompt(prompt) == prompt
    assert build_infobench_prompt(prompt.replace("\n", "\r\n")) == prompt


def test_dataset_rendering_is_put_into_the_request_frame():
    assert build_infobench_prompt(DATASET) == REQUEST
    assert build_infobench_prompt(DATASET_NO_INPUT) == REQUEST_EMPTY_INPUT


def test_preamble_before_the_instruction_marker_is_kept():
    prompt = "You are a helpful assistant.\n\n" + REQUEST
    assert build_infobench_prompt(prompt) == prompt


def test_think_hint():
    assert build_infobench_prompt(DATASET, think_tokens=128) == (
        "Instruction: Translate the sentence into French. Think for 128 tokens.\n"
        "Question: The train leaves at noon.\nGeneration:"
    )


@pytest.mark.parametrize("bad", [0, -5, 2.5, True])
def test_bad_think_tokens_raise(bad):
    with pytest.raises(RoutingError, match="think_tokens"):
        build_infobench_prompt(DATASET, think_tokens=bad)


def test_chat_template_without_tokenizer_uses_qwen3_non_thinking_layout():
    assert build_infobench_prompt(REQUEST, chat_template=True, think_tokens=64) == (
        "<|im_start|>user\nTranslate the sentence into French. Think for 64 tokens.\n\n"
        "The train leaves at noon.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_chat_template_through_a_tokenizer_disables_thinking():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")),
        chat_template=QWEN3_LIKE_TEMPLATE,
    )
    through_tokenizer = build_infobench_prompt(DATASET, chat_template=True, tokenizer=tokenizer)
    assert through_tokenizer == build_infobench_prompt(DATASET, chat_template=True)


def test_empty_prompts_raise():
    with pytest.raises(RoutingError, match="empty"):
        parse_infobench(" \r\n ")
    with pytest.raises(RoutingError, match="no instruction"):
        parse_infobench("Instruction:\nQuestion: hello\nGeneration:")
