"""Text normalisation shared by the routing parsers.

Prompts arrive with CRLF or bare CR line ends from some clients; every parser works on
``\\n`` only, so this is done once, up front, in one place — which is also where a
prompt that is not text at all is turned away with a clear error.

Runs of spaces and tabs are collapsed before parsing: the patterns allow optional
whitespace in several adjacent places ("``0 -> 1 ,  weight :  4``"), and a long run of
blanks would make them backtrack polynomially — seconds for a few kilobytes.
"""

import re

from .errors import RoutingError

# A run of blanks that is not one plain space: a space and more blanks, or any other blank
# and whatever blanks follow it. Each branch starts on one character class and runs on
# another, so the scan never backtracks; on plain text it is a third faster than
# "two or more blanks, or one odd blank".
_BLANK_RUN = re.compile(r" [^\S\n]+|[^\S\n ][^\S\n]*")


def normalize_newlines(text: str) -> str:
    """Return ``text`` with CRLF and lone CR line ends turned into ``\\n``."""
    if not isinstance(text, str):
        raise RoutingError(f"a prompt must be a string, got {type(text).__name__}")
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


def collapse_spaces(text: str) -> str:
    """``text`` with every run of blanks other than newlines turned into one space."""
    return _BLANK_RUN.sub(" ", text)
