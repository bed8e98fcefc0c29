"""Triton STRING tensors as numpy arrays and back, without Triton's Python API."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def strings(values: Sequence[str]) -> np.ndarray:
    """A Triton STRING tensor (numpy object array of UTF-8 bytes)."""
    return np.array([v.encode("utf-8") for v in values], dtype=np.object_)


def texts(array: np.ndarray) -> list[str]:
    """A STRING tensor back to str, replacing undecodable bytes (callers validate prompts first)."""
    return [
        v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)
    ]
