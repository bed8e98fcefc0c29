"""Multiple-choice (MMLU) prompts: parse, build the scoring prompt, format and extract answers.

Both renderings end in a lettered option list — under ``Options:`` with a "multiple
choice" preamble and an ``Answer:`` cue, or under ``Choices:`` with nothing else — so the
parser anchors on that list at the end of the text (:mod:`.options` finds it, inline or
one per line) and reads the stem above it. The
engine answers by scoring each label after an answer cue (one prefill, no decode);
generation with a majority vote over extracted letters remains available.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import MMLUParseError
from .options import LETTERS, OptionList, find_options
from .text import collapse_spaces, normalize_newlines

# Case-blind only after the first letter: a pattern-wide IGNORECASE makes ``re`` try every
# character of the text, while a first letter of one class lets it skip to the candidates.
_QUESTION_MARKER = re.compile(r"^[ \t]*[Qq](?i:uestion)?(?:[ \t]*\d+)?[ \t]*:[ \t]*", re.MULTILINE)
_MULTIPLE_CHOICE = re.compile(r"[Mm](?i:ultiple)[\s-]+[Cc](?i:hoice)")
_SUBJECT = re.compile(
    r"multiple[\s-]+choice\s+questions?\b[^\n]*?\babout\s+([^\n]+?)\s*\.(?:\s|$)", re.IGNORECASE
)


@dataclass(frozen=True)
class MMLUQuestion:
    """A parsed multiple-choice question: stem, option labels and texts, and the subject if stated."""

    stem: str
    labels: list[str]
    choices: list[str]
    subject: str | None = None


def has_question_marker(text: str) -> bool:
    """True when a line starts with ``Question:`` (or ``Q:``, ``Question 3:``)."""
    return _QUESTION_MARKER.search(text) is not None


def mentions_multiple_choice(text: str) -> bool:
    """True for a "multiple choice" (or "multiple-choice") phrase anywhere in the text."""
    return _MULTIPLE_CHOICE.search(text) is not None


def split_question(above: str) -> tuple[str, str]:
    """(preamble, stem) of the text above an option list; the stem may be empty.

    The stem follows the last ``Question:`` marker; without one, paragraphs that only
    announce a "multiple choice" question are the preamble and the rest is the stem.
    The router reads what a prompt asks in the preamble, not in the stem, so the two
    are told apart here, once, for the parser and the router alike.
    """
    markers = list(_QUESTION_MARKER.finditer(above))
    if markers:
        preamble, stem = above[: markers[-1].start()], above[markers[-1].end() :]
    else:
        paragraphs = re.split(r"\n\s*\n", above.strip())
        preamble_paragraphs = [p for p in paragraphs[:-1] if mentions_multiple_choice(p)]
        preamble = "\n\n".join(preamble_paragraphs)
        stem = "\n\n".join(p for p in paragraphs if p not in preamble_paragraphs)
    return preamble, "\n".join(line.strip() for line in stem.strip().split("\n"))


def question_from_options(options: OptionList) -> MMLUQuestion:
    """Split the text above a found option list into preamble and stem.

    Raises :class:`MMLUParseError` when nothing but a preamble stands above the options.
    """
    preamble, stem = split_question(options.before)
    if not stem:
        raise MMLUParseError("the multiple-choice prompt has options but no question stem above them")
    subject_match = _SUBJECT.search(preamble)
    return MMLUQuestion(
        stem=stem,
        labels=list(options.labels),
        choices=list(options.choices),
        subject=subject_match.group(1).strip() if subject_match else None,
    )


def parse_mmlu(prompt: str) -> MMLUQuestion:
    """Parse a multiple-choice question into stem, labels, choices and subject.

    Both renderings and the common paraphrases (options inline or in parentheses,
    directives after them) are read by :func:`.options.find_options`. Raises
    :class:`MMLUParseError` when the text does not end in a lettered option list (A, B,
    ... with 2 to 10 options) or has no stem above it.
    """
    options = find_options(collapse_spaces(normalize_newlines(prompt)))
    if options is None:
        raise MMLUParseError(
            "no lettered option list (A. ..., B. ..., at least two options) at the end of the prompt"
        )
    return question_from_options(options)


def build_scoring_prompt(question: MMLUQuestion) -> str:
    """The zero-shot MMLU prompt that ends in ``Answer:``; the engine then scores each label.

    The layout is the one the MMLU evaluations use, so the model sees the cue it was
    measured with; :func:`scoring_continuations` gives the exact strings to score.
    """
    subject = f" about {question.subject}" if question.subject else ""
    options = _option_lines(question)
    return (
        f"The following are multiple choice questions (with answers){subject}.\n\n"
        f"{question.stem}\n{options}\nAnswer:"
    )


CHAT_ANSWER_PREFIX = "The answer is ("


def _option_lines(question: MMLUQuestion) -> str:
    """``A. first`` … one line per option, as both renderings show them."""
    if len(question.labels) != len(question.choices) or not question.labels:
        raise MMLUParseError("a question needs one choice per label and at least one label")
    pairs = zip(question.labels, question.choices, strict=True)
    return "\n".join(f"{label}. {choice}" for label, choice in pairs)


def build_chat_question(question: MMLUQuestion) -> str:
    """The user turn of a question in chat form; the assistant's turn then starts with
    :data:`CHAT_ANSWER_PREFIX` and the engine scores each bare label after it."""
    subject = f" about {question.subject}" if question.subject else ""
    options = _option_lines(question)
    return (
        f"The following is a multiple choice question{subject}. "
        f'Answer in the format "The answer is (X)".\n\n{question.stem}\n{options}'
    )


def scoring_continuations(question: MMLUQuestion) -> list[str]:
    """The continuation scored for each label, in label order: ``" A"``, ``" B"``, ..."""
    return [f" {label}" for label in question.labels]


def format_mmlu_answer(label: str) -> str:
    """The answer in the form the request asks for: ``The answer is (X)``."""
    letter = label.strip().upper()
    if len(letter) != 1 or letter not in LETTERS:
        raise MMLUParseError(f"answer label must be one letter A-J, got {label!r}")
    return f"The answer is ({letter})"
