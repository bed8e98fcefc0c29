"""Shared fixtures: the embedded tiny Qwen3 pair, built once per checkout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_pair_dir() -> Path:
    """`.models/tiny` with target/ and draft/ (the cpu config's models), built if absent."""
    from specbatch.server.launcher import ensure_tiny_models

    ensure_tiny_models(ROOT)
    return ROOT / ".models" / "tiny"
