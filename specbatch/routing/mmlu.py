"""Multiple-choice (MMLU) prompts: parse, build the scoring prompt, format and extract answers.

Both renderings end in a lettered option list — under ``Options:`` with a "multiple
choice" preamble and an ``Answer:`` cue, or under ``Choices:`` with nothing else — so the
parser anchors on that list at the end of the text and reads the stem above it. The
engine answers by scoring each label after an answer cue (one prefill, no decode);
generation with a majority vote over extracted letters remains available.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import MMLUParseError
from .text import normalize_newlines

MAX_OPTIONS = 10
_LETTERS = "ABCDEFGHIJ"
_OPTION_LINE = re.compile(r"^[ \t]*(?:\(([A-Ja-j])\)|([A-Ja-j])[.):])[ \t]*(\S.*?)[ \t]*$")
_OPTIONS_HEADER = re.compile(r"^\s*(?:options|choices|answer\s+choices|answers)\s*:?\s*$", re.IGNORECASE)
_ANSWER_CUE = re.compile(
    r"^\s*(?:the\s+)?(?:correct\s+|final\s+)?answer(?:\s+is)?\s*:?\s*(?:let'?s\s+think\s+step\s+by\s+step\.?\s*)?$",
    re.IGNORECASE,
)
_TRAILING_DIRECTIVE = re.compile(
    r"^\s*(?:answer|respond|reply|choose|select|pick|output|give)\b[^\n]{0,100}$", re.IGNORECASE
)
_QUESTION_MARKER = re.compile(r"^[ \t]*question[ \t]*:[ \t]*", re.IGNORECASE | re.MULTILINE)
_MULTIPLE_CHOICE = re.compile(r"multiple[\s-]+choice", re.IGNORECASE)
_SUBJECT = re.compile(
    r"multiple[\s-]+choice\s+questions?\b[^\n]*?\babout\s+([^\n]+?)\s*\.(?:\s|$)", re.IGNORECASE
)
_TAIL_LINES = 2 * MAX_OPTIONS + 4


@dataclass(frozen=True)
class OptionBlock:
    """A lettered option list found at the end of a prompt.

    ``start`` is the index (in the lines given) of the first line that belongs to the block:
    the ``Options:``/``Choices:`` header when there is one, else option A.
    """

    labels: tuple[str, ...]
    choices: tuple[str, ...]
    start: int
    has_header: bool
    has_answer_cue: bool


@dataclass(frozen=True)
class MMLUQuestion:
    """A parsed multiple-choice question: stem, option labels and texts, and the subject if stated."""

    stem: str
    labels: list[str]
    choices: list[str]
    subject: str | None = None


def _option_letter(line: str) -> tuple[str, str] | None:
    match = _OPTION_LINE.match(line)
    if match is None:
        return None
    return (match.group(1) or match.group(2)).upper(), match.group(3)


def _skip_blank(lines: Sequence[str], end: int) -> int:
    while end > 0 and not lines[end - 1].strip():
        end -= 1
    return end


def find_option_block(lines: Sequence[str]) -> OptionBlock | None:
    """Find a contiguous A, B, C, ... option list (2 to 10 options) that ends the text.

    Blank lines between options are allowed; after the last option only blank lines, a
    one-line directive ("Answer with the letter only.") and an answer cue (``Answer:``)
    may follow. Returns ``None`` when the text does not end in such a list.
    """
    end = _skip_blank(lines, len(lines))
    has_answer_cue = end > 0 and _ANSWER_CUE.match(lines[end - 1]) is not None
    if has_answer_cue:
        end = _skip_blank(lines, end - 1)
    if end > 0 and _option_letter(lines[end - 1]) is None and _TRAILING_DIRECTIVE.match(lines[end - 1]):
        end -= 1
    options: list[tuple[str, str]] = []
    expected: str | None = None
    index = end - 1
    while index >= 0:
        line = lines[index]
        if not line.strip():
            index -= 1
            continue
        option = _option_letter(line)
        if option is None or (expected is not None and option[0] != expected):
            break
        options.append(option)
        if option[0] == "A":
            break
        expected = _LETTERS[_LETTERS.index(option[0]) - 1]
        index -= 1
    if len(options) < 2 or options[-1][0] != "A":
        return None
    options.reverse()
    start = index
    header_index = index - 1
    while header_index >= 0 and not lines[header_index].strip():
        header_index -= 1
    has_header = header_index >= 0 and _OPTIONS_HEADER.match(lines[header_index]) is not None
    if has_header:
        start = header_index
    return OptionBlock(
        labels=tuple(label for label, _ in options),
        choices=tuple(choice for _, choice in options),
        start=start,
        has_header=has_header,
        has_answer_cue=has_answer_cue,
    )


def tail_lines(text: str) -> list[str]:
    """The last lines of ``text``: enough to hold any option block, cheap on long prompts."""
    return text.rsplit("\n", _TAIL_LINES)


def has_question_marker(text: str) -> bool:
    """True when a line starts with ``Question:``."""
    return _QUESTION_MARKER.search(text) is not None


def mentions_multiple_choice(text: str) -> bool:
    """True for a "multiple choice" (or "multiple-choice") phrase anywhere in the text."""
    return _MULTIPLE_CHOICE.search(text) is not None


def ends_with_answer_cue(text: str) -> bool:
    """True when the last non-blank line is an answer cue such as ``Answer:``."""
    stripped = text.rstrip()
    return _ANSWER_CUE.match(stripped[stripped.rfind("\n") + 1 :]) is not None


def parse_mmlu(prompt: str) -> MMLUQuestion:
    """Parse either rendering of a multiple-choice question into stem, labels, choices, subject.

    Raises :class:`MMLUParseError` when the text does not end in a lettered option list
    (A, B, ... with 2 to 10 options) or has no stem above it.
    """
    text = normalize_newlines(prompt)
    lines = text.split("\n")
    block = find_option_block(lines)
    if block is None:
        raise MMLUParseError(
            "no lettered option list (A. ..., B. ..., at least two options) at the end of the prompt"
        )
    above = "\n".join(lines[: block.start])
    markers = list(_QUESTION_MARKER.finditer(above))
    if markers:
        preamble, stem = above[: markers[-1].start()], above[markers[-1].end() :]
    else:
        paragraphs = re.split(r"\n\s*\n", above.strip())
        preamble_paragraphs = [p for p in paragraphs[:-1] if mentions_multiple_choice(p)]
        preamble = "\n\n".join(preamble_paragraphs)
        stem = "\n\n".join(p for p in paragraphs if p not in preamble_paragraphs)
    stem = "\n".join(line.strip() for line in stem.strip().split("\n"))
    if not stem:
        raise MMLUParseError("the multiple-choice prompt has options but no question stem above them")
    subject_match = _SUBJECT.search(preamble)
    return MMLUQuestion(
        stem=stem,
        labels=list(block.labels),
        choices=list(block.choices),
        subject=subject_match.group(1).strip() if subject_match else None,
    )


def build_scoring_prompt(question: MMLUQuestion) -> str:
    """The zero-shot MMLU prompt that ends in ``Answer:``; the engine then scores each label.

    The layout is the one the MMLU evaluations use, so the model sees the cue it was
    measured with; :func:`scoring_continuations` gives the exact strings to score.
    """
    subject = f" about {question.subject}" if question.subject else ""
    if len(question.labels) != len(question.choices) or not question.labels:
        raise MMLUParseError("a question needs one choice per label and at least one label")
    pairs = zip(question.labels, question.choices, strict=True)
    options = "\n".join(f"{label}. {choice}" for label, choice in pairs)
    return (
        f"The following are multiple choice questions (with answers){subject}.\n\n"
        f"{question.stem}\n{options}\nAnswer:"
    )


CHAT_ANSWER_PREFIX = "The answer is ("


def build_chat_question(question: MMLUQuestion) -> str:
    """The user turn of a question in chat form; the assistant's turn then starts with
    :data:`CHAT_ANSWER_PREFIX` and the engine scores each bare label after it."""
    subject = f" about {question.subject}" if question.subject else ""
    if len(question.labels) != len(question.choices) or not question.labels:
        raise MMLUParseError("a question needs one choice per label and at least one label")
    pairs = zip(question.labels, question.choices, strict=True)
    options = "\n".join(f"{label}. {choice}" for label, choice in pairs)
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
    if len(letter) != 1 or letter not in _LETTERS:
        raise MMLUParseError(f"answer label must be one letter A-J, got {label!r}")
    return f"The answer is ({letter})"


_ANSWER_LEAD = r"(?i:answer(?:\s+is)?\s*:?\s*(?:option\s+|choice\s+)?)"
_EXPLICIT_ANSWER = re.compile(
    _ANSWER_LEAD + r"(?:\*\*)?\(?\s*([A-J])\s*\)?(?:\*\*)?(?![A-Za-z0-9])|" + _ANSWER_LEAD + r"\(([a-j])\)"
)
_MARKED_LETTER = re.compile(r"\*\*\(?([A-J])\)?[.:)]?\*\*|\(([A-J])\)|\\boxed\{([A-J])\}")
_LEADING_LETTER = re.compile(r"^\s*(?i:option\s+|choice\s+)?\(?([A-J])(?:[.:)]|\s*$|\s+-\s)")


def extract_choice_letter(text: str, labels: Sequence[str]) -> str | None:
    """The option letter a free-text answer commits to, or ``None`` when it names none.

    In order of trust: the last explicit "answer is (C)" / "Answer: C"; a marked letter
    such as ``**C**``, ``(C)`` or ``\\boxed{C}``; a reply that starts with the letter
    (``C.``, ``C)``, ``C``). Only letters among ``labels`` count.
    """
    allowed = {label.upper() for label in labels}

    def pick(groups: Iterable[str | None]) -> str | None:
        for group in groups:
            if group and group.upper() in allowed:
                return group.upper()
        return None

    for match in reversed(list(_EXPLICIT_ANSWER.finditer(text))):
        letter = pick(match.groups())
        if letter:
            return letter
    for match in reversed(list(_MARKED_LETTER.finditer(text))):
        letter = pick(match.groups())
        if letter:
            return letter
    leading = _LEADING_LETTER.match(text)
    return pick(leading.groups()) if leading else None


def majority_vote(texts: Iterable[str], labels: Sequence[str]) -> str | None:
    """The most frequent extracted letter over best-of-n generations; ties go to the first seen."""
    votes = Counter(
        letter for letter in (extract_choice_letter(text, labels) for text in texts) if letter is not None
    )
    if not votes:
        return None
    return votes.most_common(1)[0][0]
