"""The acceptance rate of speculative decoding: accepted draft tokens over drafted ones.

The engine's result and the scheduler's answer both report it. It lives outside
``specbatch.decoding``, whose package imports torch, so the torch-free scheduler process
computes it with the same code as the engine.
"""

from __future__ import annotations


def acceptance_rate(drafted: int, accepted: int) -> float:
    """``accepted / drafted``; 0.0 when nothing was drafted (target-only and draft-only rows)."""
    return accepted / drafted if drafted else 0.0
