"""Multiple-choice prompts: parsing both renderings, the scoring prompt, answers and letter extraction."""

from __future__ import annotations

import pytest

from specbatch.routing import (
    MMLUQuestion,
    build_scoring_prompt,
    format_mmlu_answer,
    parse_mmlu,
    scoring_continuations,
)
from specbatch.routing.errors import MMLUParseError

REQUEST = (
    "The following is a multiple choice question (with answers) about medical genetics.  Output the answer "
    'in the format of "The answer is (X)" at the end.\n\nQuestion: Which of the following is the mode of '
    "inheritance of cystic fibrosis?\n Options:\nA. Autosomal dominant\nB. Autosomal recessive\n"
    "C. X-linked recessive\nD. Mitochondrial\nAnswer:"
)
DATASET = (
    "Question:\nThe HIV protein that binds the CD4 receptor is\n\nChoices:\nA. gp41\nB. p24\nC. gp120\n"
    "D. integrase\nE. p17"
)


def test_request_rendering():
    question = parse_mmlu(REQUEST)
    assert question == MMLUQuestion(
        stem="Which of the following is the mode of inheritance of cystic fibrosis?",
        labels=["A", "B", "C", "D"],
        choices=["Autosomal dominant", "Autosomal recessive", "X-linked recessive", "Mitochondrial"],
        subject="medical genetics",
    )


def test_dataset_rendering_with_five_options():
    question = parse_mmlu(DATASET)
    assert question.stem == "The HIV protein that binds the CD4 receptor is"
    assert question.labels == ["A", "B", "C", "D", "E"]
    assert question.choices == ["gp41", "p24", "gp120", "integrase", "p17"]
    assert question.subject is None


@pytest.mark.parametrize(
    "transform",
    [
        lambda t: t.replace("\n", "\r\n"),
        lambda t: t.replace("\n\n", "\n"),
        lambda t: "Please answer.\n\n" + t,
        lambda t: "\n".join("\t" + line + "  " for line in t.split("\n")),
        lambda t: (
            t.replace("\nA. ", "\n(A) ")
            .replace("\nB. ", "\n(B) ")
            .replace("\nC. ", "\n(C) ")
            .replace("\nD. ", "\n(D) ")
            .replace("\nE. ", "\n(E) ")
        ),
    ],
)
def test_perturbed_dataset_rendering_parses_the_same(transform):
    assert parse_mmlu(transform(DATASET)) == parse_mmlu(DATASET)


def test_lower_case_labels_come_back_upper_case():
    question = parse_mmlu(REQUEST.lower())
    assert question.labels == ["A", "B", "C", "D"]
    assert question.subject == "medical genetics"


def test_two_and_ten_options():
    assert parse_mmlu("Question: Is the sky blue?\nChoices:\nA) yes\nB) no").labels == ["A", "B"]
    options = "\n".join(f"{letter}. choice {letter}" for letter in "ABCDEFGHIJ")
    assert parse_mmlu(f"Question: Pick one.\nOptions:\n{options}\nAnswer:").labels == list("ABCDEFGHIJ")


def test_roman_numerals_in_the_stem_stay_in_the_stem():
    prompt = (
        "Question: Which statements are true?\nI. The heart has four chambers.\nII. Veins carry oxygenated "
        "blood.\nChoices:\nA. I only\nB. II only\nC. I and II\nD. Neither"
    )
    question = parse_mmlu(prompt)
    assert question.stem.endswith("II. Veins carry oxygenated blood.")
    assert question.choices[0] == "I only"


@pytest.mark.parametrize(
    "prompt",
    [
        "Question: What is the largest organ?\nAnswer:",
        "Question: Pick one.\nChoices:\nA. only option",
        "Question: Pick one.\nChoices:\nA. first\nC. third",
        "Choices:\nA. first\nB. second",
    ],
)
def test_unparseable_questions_raise(prompt: str):
    with pytest.raises(MMLUParseError):
        parse_mmlu(prompt)


def test_scoring_prompt_and_continuations_are_exact():
    question = parse_mmlu(REQUEST)
    assert build_scoring_prompt(question) == (
        "The following are multiple choice questions (with answers) about medical genetics.\n\n"
        "Which of the following is the mode of inheritance of cystic fibrosis?\n"
        "A. Autosomal dominant\nB. Autosomal recessive\nC. X-linked recessive\nD. Mitochondrial\nAnswer:"
    )
    assert scoring_continuations(question) == [" A", " B", " C", " D"]
    assert build_scoring_prompt(parse_mmlu(DATASET)).startswith(
        "The following are multiple choice questions (with answers).\n\nThe HIV protein"
    )


def test_format_answer():
    assert format_mmlu_answer("c") == "The answer is (C)"
    with pytest.raises(MMLUParseError):
        format_mmlu_answer("CD")


LABELS = ["A", "B", "C", "D"]
