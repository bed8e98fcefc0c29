"""Prefix reuse changes speed, never tokens: in float64 a greedy row that starts on cached
blocks produces token for token what it produces computed whole, however it is batched
and whether it was preempted while sharing; seeded sampled rows reproduce; and a hit
really spares the models the tokens it holds."""

from __future__ import annotations

import pytest
from pairs import prompts

from specbatch.decoding import Engine, GenerationRequest, ModelPair

NEW_TOKENS = 16
SYSTEM_TOKENS = 45


def shared_prompts(pair: ModelPair, count: int, seed: int = 31) -> list[list[int]]:
    """``count`` prompts that start with the same system prompt and end in short turns."""
    system = prompts(1, pair.vocab_size, seed=seed, min_len=SYSTEM_TOKENS, max_len=SYSTEM_TOKENS)[0]
    turns = prompts(count, pair.vocab_size, seed=seed + 1, min_len=1, max_len=9)
    return [system + turn for turn in turns]


def greedy(rows: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[GenerationRequest]:
    return [GenerationRequest(p, max_new_tokens=new_tokens) for p in rows]


def computed_whole(pair: ModelPair, requests: list[GenerationRequest]) -> list[list[int]]:
    """Each request decoded alone by the target, with no prefix reuse."""
    engine = Engine(pair, prefix_caching=False)
    return [engine.generate([r], mode="target_only")[0].tokens for r in requests]


@pytest.mark.parametrize(("lookahead", "block_size"), [(3, 4), (8, 16), ("goodput", 8), (0, 4)])
def test_greedy_rows_with_a_hit_equal_the_rows_computed_whole(pair, lookahead, block_size) -> None:
    rows = shared_prompts(pair, 6)
    requests = greedy(rows)
    expected = computed_whole(pair, requests)
    engine = Engine(pair, lookahead=lookahead, block_size=block_size)
    warm = engine.generate(requests[:1])  # the system prompt's blocks are named now
    assert warm[0].tokens == expected[0]
    for batch in (6, 2, 1):  # hits batched with each other and with misses of earlier rows
        results = engine.generate(requests[:batch])
        assert [r.tokens for r in results] == expected[:batch], f"batch {batch}"
    stats = engine.snapshot()
    assert stats.prefix_hit_tokens >= 8 * (SYSTEM_TOKENS // block_size) * block_size
    assert engine.pool.num_held == 0
    assert stats.evictable_blocks == stats.cached_blocks > 0


def test_a_row_that_resumes_a_conversation_hits_the_blocks_of_its_previous_answer(pair) -> None:
    first = shared_prompts(pair, 1)[0]
    engine = Engine(pair, lookahead=3, block_size=4)
    answer = engine.generate(greedy([first], 24))[0].tokens
    follow_up = first + answer + prompts(1, pair.vocab_size, seed=40, min_len=5, max_len=5)[0]
    before = engine.snapshot().prefix_hit_tokens
    result = engine.generate(greedy([follow_up]))[0]
    # the target held every token of the first turn but the answer's last one
    whole_blocks = (len(first) + len(answer) - 1) // 4 * 4
    assert engine.snapshot().prefix_hit_tokens - before == whole_blocks
    assert result.tokens == computed_whole(pair, greedy([follow_up]))[0]


def test_preempted_rows_holding_shared_blocks_stay_exact_and_leak_nothing(pair) -> None:
    rows = shared_prompts(pair, 6, seed=33)
    requests = greedy(rows, 24)
    expected = computed_whole(pair, requests)
    block = 4
    # room for two rows at full length: sharing the prefix, all six are admitted at once
    # and preempted as they grow
    budget = 2 * (SYSTEM_TOKENS + 9 + 24 + 8) * pair.kv_bytes_per_token
    engine = Engine(pair, lookahead=4, kv_memory_budget_bytes=budget, block_size=block)
    engine.generate(requests[:1])
    steps = []  # per step: (blocks held twice or more often, blocks held, the pool's count)

    def watch(_: dict) -> None:
        held = [b for r in engine._running for b in r.blocks]
        steps.append((len(held) - len(set(held)), len(set(held)), engine.pool.num_held))

    results = engine.generate(requests, on_step=watch)
    assert engine.snapshot().preemptions > 0
    assert max(shared for shared, _, _ in steps) > 0
    assert all(held == counted for _, held, counted in steps)
    assert [r.tokens for r in results] == expected
    assert engine.pool.num_held == 0
    assert engine.pool.num_free == engine.pool.num_blocks


def test_seeded_sampled_rows_reproduce_with_and_without_a_hit(pair) -> None:
    rows = shared_prompts(pair, 4, seed=35)
    requests = [
        GenerationRequest(p, max_new_tokens=NEW_TOKENS, temperature=0.8, top_k=20, seed=100 + i)
        for i, p in enumerate(rows)
    ]
    whole = Engine(pair, lookahead=3, prefix_caching=False).generate(requests)
    engine = Engine(pair, lookahead=3, block_size=4)
    engine.generate(requests)
    hit = engine.generate(requests)
    assert engine.snapshot().prefix_hit_tokens > 0
    assert [r.tokens for r in hit] == [r.tokens for r in whole]


def test_a_hit_spares_each_model_the_tokens_it_holds(pair) -> None:
    rows = shared_prompts(pair, 2, seed=37)
    fed: dict[str, list[tuple[int, int]]] = {"target": [], "draft": []}

    def observe(model, keys, tokens, positions, real) -> None:
        for b, key in enumerate(keys):
            fed[model] += [(key, int(p)) for p, r in zip(positions[b], real[b], strict=True) if bool(r)]

    engine = Engine(pair, lookahead=2, block_size=4)
    engine.generate(greedy(rows[:1]))
    engine.feed_observer = observe
    result = engine.generate(greedy(rows[1:]))[0]
    shared = SYSTEM_TOKENS // 4 * 4
    assert min(p for _, p in fed["draft"]) == shared  # the first row's draft wrote them too
    committed = len(rows[1]) + NEW_TOKENS
    assert {p for _, p in fed["target"]} == set(range(shared, committed - 1))
    assert result.tokens == computed_whole(pair, greedy(rows[1:]))[0]
