"""Find the lettered option list that ends a multiple-choice prompt.

Options come one per line (``A. …``, ``(A) …``, ``- B) …``, ``**C.** …``, ``Option D: …``)
or all on one line (``Which gas? A) oxygen B) carbon dioxide C) nitrogen``). Either way
the list must run A, B, C, … without a gap, hold 2 to 10 options, and end the prompt —
only blank lines, up to two short directives ("Answer with the letter only.", "Which one
is correct?") and an answer cue (``Answer:``) may follow. A list anywhere else in the
text is part of an instruction, not a question to answer with a letter.

Only the last lines of the text are searched, so finding (or not finding) a list costs
the same on a long prompt as on a short one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_OPTIONS = 10
LETTERS = "ABCDEFGHIJ"
_TAIL_LINES = 2 * MAX_OPTIONS + 6
_MAX_DIRECTIVES = 2

# Case-blind only where it matters: the letter classes hold both cases already, and a
# pattern-wide IGNORECASE costs every line of every prompt.
_OPTION_LINE = re.compile(
    r"^[ \t]*(?:[-*•+][ \t]+)?(?:\*\*|__)?(?:(?i:option|choice)[ \t]+)?"
    r"(?:\(([A-Ja-j])\)|\[([A-Ja-j])\]|([A-Ja-j])[.):])(?:\*\*|__)?[ \t]*(\S.*)"
)
_OPTIONS_HEADER = re.compile(
    r"^\s*(?:\*\*|#+\s*)?(?:options|choices|answer\s+(?:choices|options)|possible\s+answers|answers|alternatives)"
    r"\s*:?\s*(?:\*\*)?\s*:?\s*$",
    re.IGNORECASE,
)
_INLINE_HEADER = re.compile(
    r"(?:^|\s)(?:options|choices|answer\s+(?:choices|options)|possible\s+answers|answers)\s*:\s*$",
    re.IGNORECASE,
)
ANSWER_CUE = re.compile(
    r"^\s*a\s*:\s*$|^\s*(?:the\s+|your\s+)?(?:correct\s+|final\s+|best\s+)?"
    r"(?:answer|antwort|respuesta|réponse|risposta|resposta|antwoord)(?:\s+is)?\s*(?:\([^)\n]{0,30}\))?\s*:?\s*"
    r"(?:_+|\.\.\.|…)?\s*(?:let'?s\s+think\s+step\s+by\s+step\.?\s*)?$",
    re.IGNORECASE,
)
_TRAILING_DIRECTIVE = re.compile(
    r"^\s*(?:\*\*)?(?:please\s+)?(?:answer|respond|reply|choose|select|pick|output|give|return|state|indicate|"
    r"write|provide|circle|mark|identify|only|just|your\s+(?:answer|response|reply)|note)\b[^\n]{0,120}$"
    r"|^\s*(?:which|what)\b[^\n]{0,100}\?\s*$"
    r"|^\s*[\[(]\s*\d+\s*(?:marks?|points?|pts?)\s*[\])]\s*$",
    re.IGNORECASE,
)
_INLINE_STYLES = (
    re.compile(r"(?:^|(?<=[\s,;:]))\(([A-Ja-j])\)\s*"),
    re.compile(r"(?:^|(?<=[\s,;:]))\[([A-Ja-j])\]\s*"),
    re.compile(r"(?:^|(?<=[\s,;:]))([A-Ja-j])\)\s+"),
    re.compile(r"(?:^|(?<=[\s,;:]))([A-J])[.:]\s+"),
)
_LOOSE_STYLE = _INLINE_STYLES[-1]
_SEPARATOR_TAIL = re.compile(r"\s*[,;]?\s*(?:\b(?:or|and)\b)?\s*$", re.IGNORECASE)
_DIRECTIVE_SPLIT = re.compile(
    r"(?<=[.?!])\s+(?=(?:please\s+)?(?:answer|respond|reply|choose|select|pick|give|output|return|only|which)\b)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class OptionList:
    """A lettered option list that ends a prompt, and the text around it.

    ``before`` is everything above the options (an ``Options:`` header excluded);
    ``after`` holds the directives and answer cue that follow them.
    """

    labels: tuple[str, ...]
    choices: tuple[str, ...]
    before: str
    after: str
    has_header: bool
    has_answer_cue: bool
    inline: bool


def option_letter(line: str) -> tuple[str, str] | None:
    """(letter, text) for a line that is one option, such as ``(B) Carbon dioxide``."""
    match = _OPTION_LINE.match(line)
    if match is None:
        return None
    parenthesised, bracketed, bare, text = match.groups()
    # Trailing blanks are stripped here, not by a lazy ``.*?`` in the pattern: a lazy
    # group tries the end of the line at every character and costs four times as much.
    return (parenthesised or bracketed or bare).upper(), text.rstrip(" \t")


def _skip_blank(lines: Sequence[str], end: int) -> int:
    while end > 0 and not lines[end - 1].strip():
        end -= 1
    return end


def _peel_trailer(lines: Sequence[str]) -> tuple[int, bool]:
    """The end of the option region, and whether an answer cue closes the prompt."""
    end = _skip_blank(lines, len(lines))
    has_cue = end > 0 and ANSWER_CUE.match(lines[end - 1]) is not None
    if has_cue:
        end = _skip_blank(lines, end - 1)
    for _ in range(_MAX_DIRECTIVES):
        line = lines[end - 1] if end > 0 else ""
        if (
            end == 0
            or option_letter(line) is not None
            or not _TRAILING_DIRECTIVE.match(line)
            or _inline_options(line) is not None
        ):
            break
        end = _skip_blank(lines, end - 1)
    return end, has_cue


def _line_block(lines: Sequence[str], end: int) -> tuple[int, list[tuple[str, str]]] | None:
    """(index of option A, options) for one-option-per-line options ending at ``end``."""
    options: list[tuple[str, str]] = []
    expected: str | None = None
    index = end - 1
    while index >= 0:
        line = lines[index]
        if not line.strip():
            index -= 1
            continue
        option = option_letter(line)
        if option is None or (expected is not None and option[0] != expected):
            break
        options.append(option)
        if option[0] == "A":
            break
        expected = LETTERS[LETTERS.index(option[0]) - 1]
        index -= 1
    if len(options) < 2 or options[-1][0] != "A":
        return None
    options.reverse()
    return index, options


def _inline_options(line: str) -> tuple[str, list[tuple[str, str]], str] | None:
    """(text before option A, options, trailing directive) for options written on one line."""
    for style in _INLINE_STYLES:
        markers = list(style.finditer(line))
        first = next((i for i, m in enumerate(markers) if m.group(1) in "Aa"), None)
        if first is None:
            continue
        markers = markers[first:]
        letters = [m.group(1) for m in markers]
        expected = (LETTERS if letters[0] == "A" else LETTERS.lower())[: len(letters)]
        if len(letters) < 2 or "".join(letters) != expected:
            continue
        stem = line[: markers[0].start()]
        if style is _LOOSE_STYLE and stem.strip() and stem.rstrip()[-1] not in "?:":
            continue
        ends = [m.start() for m in markers[1:]] + [len(line)]
        spans = zip(markers, ends, strict=True)
        texts = [_SEPARATOR_TAIL.sub("", line[marker.end() : stop]).strip() for marker, stop in spans]
        last = _DIRECTIVE_SPLIT.split(texts[-1], maxsplit=1)
        trailer = last[1] if len(last) > 1 else ""
        texts[-1] = last[0].strip().rstrip(".") if trailer else last[0].strip()
        if not trailer and texts[-1].endswith("?"):
            # "Which organelle makes ATP: (A) …, (B) … or (C) a mitochondrion?": the question
            # mark closes the question around the options, not the last option.
            texts[-1], trailer = texts[-1][:-1].rstrip(), "?"
        if not all(texts):
            continue
        return stem, [(letter.upper(), text) for letter, text in zip(letters, texts, strict=True)], trailer
    return None


def _header_above(lines: Sequence[str], index: int) -> int | None:
    """The index of an ``Options:`` header line right above line ``index`` (blank lines between)."""
    previous = _skip_blank(lines, index)
    return previous - 1 if previous > 0 and _OPTIONS_HEADER.match(lines[previous - 1]) else None


def find_options(text: str) -> OptionList | None:
    """The option list that ends ``text``, or ``None`` when there is none.

    ``text`` has ``\\n`` line ends and collapsed blanks (:func:`.text.collapse_spaces`).
    """
    parts = text.rsplit("\n", _TAIL_LINES)
    head, lines = (parts[0] + "\n", parts[1:]) if len(parts) > _TAIL_LINES else ("", parts)
    end, has_cue = _peel_trailer(lines)
    after = "\n".join(lines[end:]).strip()
    block = _line_block(lines, end)
    if block is not None:
        first, options = block
        header = _header_above(lines, first)
        return OptionList(
            labels=tuple(label for label, _ in options),
            choices=tuple(choice for _, choice in options),
            before=head + "\n".join(lines[: first if header is None else header]),
            after=after,
            has_header=header is not None,
            has_answer_cue=has_cue,
            inline=False,
        )
    inline = _inline_options(lines[end - 1]) if end > 0 else None
    if inline is None:
        return None
    stem, options, trailer = inline
    inline_header = _INLINE_HEADER.search(stem)
    header = None if inline_header is not None or stem.strip() else _header_above(lines, end - 1)
    if inline_header is not None:
        stem = stem[: inline_header.start()]
    above = [*lines[: end - 1], stem] if header is None else lines[:header]
    return OptionList(
        labels=tuple(label for label, _ in options),
        choices=tuple(choice for _, choice in options),
        before=head + "\n".join(above),
        after=f"{trailer}\n{after}".strip(),
        has_header=inline_header is not None or header is not None,
        has_answer_cue=has_cue,
        inline=True,
    )
