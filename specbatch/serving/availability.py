"""Which error messages mean "the server cannot serve this now, retry": one list for
every front that has to tell a client so.

Triton's ensemble passes the scheduler's UNAVAILABLE on to HTTP clients as 400, its
gRPC stream carries no status at all, and a model that is being brought back answers
404 ("has no available versions"). So the gateway and the OpenAI front classify by
the message, and both by this one list.
"""

from __future__ import annotations

import re

UNAVAILABLE = re.compile(
    "|".join(
        (
            r"overload",
            r"queue is full",
            r"unavailable",
            r"try again later",
            r"not ready",
            r"shutting down",
            r"is not healthy",  # a Triton step whose stub process died
            r"has no available versions",  # a model unloaded while it is brought back
            r"restart",
            r"graph solver is busy",
            r"out of service",
            # the connection to tritonserver broke mid-request (gRPC core's words): it
            # was killed or is restarting, so the request can be sent again
            r"stream removed",
            r"socket closed",
            r"connection reset",
        )
    ),
    re.IGNORECASE,
)


def is_unavailable(message: str) -> bool:
    return UNAVAILABLE.search(message) is not None
