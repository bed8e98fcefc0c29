"""Text normalisation shared by the routing parsers.

Prompts arrive with CRLF or bare CR line ends from some clients; every parser works on
``\\n`` only, so this is done once, up front, in one place — which is also where a
prompt that is not text at all is turned away with a clear error.
"""

from .errors import RoutingError


def normalize_newlines(text: str) -> str:
    """Return ``text`` with CRLF and lone CR line ends turned into ``\\n``."""
    if not isinstance(text, str):
        raise RoutingError(f"a prompt must be a string, got {type(text).__name__}")
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")
