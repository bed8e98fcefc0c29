"""Fixtures of the model tests: the tokenizer and the pairs they run on, built once per
session; a test that needs another pair (other weights, EOS kept, another dtype) builds
it with :mod:`pairs`.

The decoding tests run on ``pair`` (in memory); the serving tests on ``tiny_pair``, the
embedded pair the server loads, so the scheduler's token counts are the engine's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pairs import bpe_tokenizer, make_pair
from serving_fixtures import make_engine
from transformers import PreTrainedTokenizerFast

from specbatch.decoding import Engine, ModelPair, load_model_pair


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    """The project's tiny BPE tokenizer."""
    return bpe_tokenizer()


@pytest.fixture(scope="session")
def pair() -> ModelPair:
    """A controlled pair (target = draft + layers scaled by ε = 0.3) in float64, EOS off:
    outputs run to their budget, and speculative and plain decoding agree token for token."""
    return make_pair("controlled", epsilon=0.3)


@pytest.fixture(scope="session")
def tiny_pair(tiny_pair_dir: Path) -> ModelPair:
    """The embedded tiny pair from disk, in float64 with EOS disabled: every generated row
    runs to its budget, and a row asked for many tokens is still running when a test
    cancels or loses it."""
    loaded = load_model_pair(
        str(tiny_pair_dir / "target"), str(tiny_pair_dir / "draft"), device="cpu", dtype="float64"
    )
    loaded.eos_token_ids.clear()
    return loaded


@pytest.fixture(scope="module")
def reference(tiny_pair: ModelPair) -> Engine:
    """An engine of its own: what a prompt's output is when nothing else runs beside it."""
    return make_engine(tiny_pair)
