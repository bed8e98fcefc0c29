"""Exact, batched, KV-cached speculative decoding over a Qwen3 target and draft.

Public entry points: :func:`load_model_pair` to load the models, :class:`Engine` to
generate (speculative, target-only or draft-only) and score multiple-choice labels,
and :func:`build_tiny_pair` to build the deterministic embedded default pair.
"""

from specbatch.decoding.engine import Engine
from specbatch.decoding.pair import IncompatiblePairError, ModelPair, load_model_pair, pair_from_models
from specbatch.decoding.requests import GenerationRequest, GenerationResult, UnrunnableRequestError
from specbatch.decoding.scoring import ChoiceScores
from specbatch.decoding.tiny import build_tiny_pair

__all__ = [
    "ChoiceScores",
    "Engine",
    "GenerationRequest",
    "GenerationResult",
    "IncompatiblePairError",
    "ModelPair",
    "UnrunnableRequestError",
    "build_tiny_pair",
    "load_model_pair",
    "pair_from_models",
]
