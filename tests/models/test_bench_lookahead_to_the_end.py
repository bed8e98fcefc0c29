"""bench_lookahead's whole-workload rounds (``--requests-per-client``): every engine
serves the same requests to the end under the relay, so every policy streams the same
tokens and only its seconds differ."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_continuous import Job
from bench_lookahead import ClosedLoop, PassesOnlyEngine, Relay, _to_the_end

from specbatch.decoding import Engine, GenerationRequest, ModelPair
from specbatch.decoding.lookahead import iteration_costs_name


def test_every_engine_serves_the_same_requests_to_the_end(pair: ModelPair) -> None:
    ids = pair.tokenizer.encode("the quick brown fox jumps over the lazy dog " * 6, add_special_tokens=False)
    jobs = [Job(ids[i : i + 10 + i], 2 + i % 5) for i in range(9)]
    relay = Relay()
    engines = {
        "target_only": Engine(pair, lookahead=0, max_rows=4),
        "fixed_2": Engine(pair, lookahead=2, max_rows=4),
    }
    for name, engine in engines.items():
        engine.step_hook = relay.gate(name)
    loops = {
        name: ClosedLoop(engine, jobs, 3, "target_only" if name == "target_only" else "speculative", limit=7)
        for name, engine in engines.items()
    }
    timed = _to_the_end(relay, engines, loops, rotation=0, slice_seconds=0.01)
    for name, (seconds, tokens) in timed.items():
        assert loops[name].finished.is_set()
        assert tokens == sum(job.new_tokens for job in jobs[:7])  # the first 7 requests, EOS off
        assert seconds > 0
        assert engines[name].loop_thread is None  # nothing left running once the relay let go


def test_the_passes_only_ablation_learns_no_iteration_cost(pair: ModelPair) -> None:
    # goodput_passes_only is goodput told its passes' seconds alone: its iteration cost
    # model stays at zero, where goodput's learns what admitting, choosing and delivering
    # took around every step
    ids = pair.tokenizer.encode("the quick brown fox jumps over the lazy dog " * 3, add_special_tokens=False)
    requests = [GenerationRequest(ids[i : i + 12], max_new_tokens=6) for i in range(3)]
    told = {}
    for kind in (Engine, PassesOnlyEngine):
        engine = kind(pair, lookahead="goodput", max_rows=4)
        engine.generate(requests)
        iterations = [engine.runner.costs[iteration_costs_name(k)] for k in (0, 1)]
        assert sum(model.observations for model in iterations) > 0
        told[kind] = max(model.predict(1, 0, 0) for model in iterations)
    assert told[PassesOnlyEngine] == 0.0
    assert told[Engine] > 0.0
