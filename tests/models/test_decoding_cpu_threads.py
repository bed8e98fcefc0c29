"""A CPU instance loads on one torch thread and its engine's loop computes on the
threads it was given, so the process holds one OpenMP team (see
specbatch/decoding/cpu_threads.py for why a second one slows every step)."""

from __future__ import annotations

import pytest
import torch

from specbatch.decoding import Engine, GenerationRequest, ModelPair
from specbatch.decoding.cpu_threads import threads_for_the_engine_loop


def test_the_engine_is_built_on_one_thread_and_its_loop_computes_on_the_instances_threads(
    pair: ModelPair,
) -> None:
    seen: dict[str, int] = {}
    before = torch.get_num_threads()
    try:
        with threads_for_the_engine_loop(2):
            seen["building"] = torch.get_num_threads()
            engine = Engine(pair)
        engine.step_hook = lambda: seen.setdefault("loop", torch.get_num_threads())
        result = engine.generate([GenerationRequest([5, 6, 7], max_new_tokens=2)])[0]
    finally:
        torch.set_num_threads(before)
    assert result.finish_reason == "length"
    assert seen == {"building": 1, "loop": 2}


def test_an_instance_needs_at_least_one_thread() -> None:
    with pytest.raises(ValueError, match="at least 1"), threads_for_the_engine_loop(0):
        pass
