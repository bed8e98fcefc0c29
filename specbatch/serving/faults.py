"""Fault injection for tests: prompts that make a chosen part of the server fail.

Only with SPECBATCH_FAULT_INJECTION=1 in the server's environment: a prompt containing
``[[fault:scheduler]]`` makes the scheduler's loop raise while it schedules,
``[[fault:instance]]`` makes the engine step of the instance running it raise,
``[[fault:hang]]`` makes that engine step block for good (a hung instance), and
``[[fault:reply]]`` makes building its final response raise. The tests use them to
prove that every request still gets exactly one final answer.
"""

from __future__ import annotations

import os

ENV = "SPECBATCH_FAULT_INJECTION"


class InjectedFault(RuntimeError):
    """Raised on purpose by a marked prompt."""


def marked(text: str, where: str) -> bool:
    """Whether ``text`` asks for a fault at ``where`` and fault injection is on."""
    return os.environ.get(ENV) == "1" and f"[[fault:{where}]]" in text
