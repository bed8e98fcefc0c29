"""The graph solver's worker process: one prompt in, one answer out, forever.

Runs as ``python -m specbatch.routing.solver_worker`` under :mod:`.solver_pool`, which
kills it when a solve overruns its time limit — the only way to stop pure-Python work
that has gone exponential. It speaks line-delimited JSON on stdin/stdout (no object serialisation:
the channel carries text and nothing else), ignores SIGINT (a Ctrl-C to the server's
process group is the server's to handle) and exits when its parent is gone, so a
crashed server leaves no solver behind.
"""

from __future__ import annotations

import json
import signal
import sys

from specbatch.lifeline import exit_with_parent

from .errors import GraphLimitError
from .graph import solve_graph

READY = {"ready": True}


def answer(text: str) -> dict[str, str]:
    """The reply for one prompt: its answer, or the error with a kind the pool maps to an exception."""
    try:
        return {"answer": solve_graph(text)}
    except GraphLimitError as exc:
        return {"error": str(exc), "kind": "limit"}
    except ValueError as exc:
        return {"error": str(exc), "kind": "graph"}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "kind": "internal"}


def _write_reply(message: dict) -> None:
    sys.stdout.buffer.write(json.dumps(message).encode() + b"\n")
    sys.stdout.buffer.flush()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent("the graph solver")
    _write_reply(READY)
    for line in sys.stdin.buffer:
        _write_reply(answer(json.loads(line)["text"]))


if __name__ == "__main__":
    main()
