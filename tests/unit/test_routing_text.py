"""Text normalisation: line ends and runs of blanks, the same whatever path the text takes."""

from __future__ import annotations

import random
import re

import pytest

from specbatch.routing import RoutingError
from specbatch.routing.text import collapse_spaces, normalize_newlines

# The rule, stated once as a plain pattern: every run of blanks other than newlines that is
# not a single space becomes one space.
_RULE = re.compile(r"[^\S\n]{2,}|[^\S\n ]")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("one  two   three", "one two three"),
        ("tab\there \t and\t\tthere", "tab here and there"),
        ("keeps\n\nnewlines \n and  spaces", "keeps\n\nnewlines \n and spaces"),
        ("non\u00a0breaking\u2003and\u3000wide", "non breaking and wide"),
        ("separators\x1c\x1dtoo", "separators too"),
        (" " * 1000 + "x", " x"),
        ("", ""),
    ],
)
def test_runs_of_blanks_become_one_space(text: str, expected: str):
    assert collapse_spaces(text) == expected


def test_every_mix_of_blanks_follows_the_rule():
    rng = random.Random(7)
    alphabet = [" ", "  ", "\n", "\t", "a", "\x0b", "\x0c", "\u00a0", "\u2003", "\x1f", "é"]
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        assert collapse_spaces(text) == _RULE.sub(" ", text), repr(text)


def test_line_ends_become_newlines_and_non_text_is_refused():
    assert normalize_newlines("a\r\nb\rc\nd") == "a\nb\nc\nd"
    with pytest.raises(RoutingError):
        normalize_newlines(b"bytes")  # type: ignore[arg-type]
