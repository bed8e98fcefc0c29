"""Fixtures of the unit tests, which load no model: the project's tokenizer, built alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from specbatch.decoding.tokenizer_build import build_tokenizer


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tokenizer the tiny pair carries (Qwen3's chat template), in a folder of its own."""
    directory = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(directory)
    return directory


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path) -> PreTrainedTokenizerFast:
    return AutoTokenizer.from_pretrained(tokenizer_dir)
