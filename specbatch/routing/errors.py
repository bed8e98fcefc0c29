"""Errors raised for prompts the router cannot handle.

All are ``ValueError`` subclasses so that callers which only know "bad input" can
catch them generically, while the server can still tell a routing failure apart
from an engine failure and answer that one prompt with its message.
"""


class RoutingError(ValueError):
    """A prompt (or an explicit task name) that the router cannot route or answer."""


class GraphError(RoutingError):
    """A graph prompt that cannot be parsed or asks for something out of range."""


class GraphLimitError(GraphError):
    """A graph prompt that reads correctly but is larger (nodes, edges, P) than one prompt may ask for."""


class MMLUParseError(RoutingError):
    """A multiple-choice prompt whose stem or lettered options cannot be found."""


class GraphTimeoutError(GraphLimitError):
    """A graph prompt within the size limits whose paths take longer than the solver's time limit."""
