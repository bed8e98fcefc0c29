"""Block accounting of prefix reuse, on plain rows and no model: reference counts, the
evictable set and its order, hits and their lengths per model, the draft's claims on
shared blocks, and rows that leave (finished or preempted) while others share their
blocks."""

from __future__ import annotations

import pytest

from specbatch.decoding.kv_blocks import BlockPool, OutOfBlocksError
from specbatch.decoding.prefix_cache import ROOT_DIGEST, PrefixCache, chain_digest, reachable_hits
from specbatch.decoding.requests import GenerationRequest
from specbatch.decoding.rows import Row, RowHandle
from specbatch.decoding.stopping import RowOutput

SIZE = 4


def make_row(tokens: list[int], mode: str = "speculative") -> Row:
    return Row(
        handle=RowHandle(),
        request=GenerationRequest(tokens),
        mode=mode,
        tokens=list(tokens),
        prompt_length=len(tokens),
        output=RowOutput(8, ()),
        seed=0,
        sink=None,
        key=0,
    )


def admitted(cache: PrefixCache, tokens: list[int], mode: str = "speculative") -> Row:
    """A row admitted as the engine admits it: its hit shared, the rest grown."""
    row = make_row(tokens, mode)
    cache.admit(row, cache.match(row))
    cache.pool.grow(row.blocks, row.seq_len)
    return row


def computed(cache: PrefixCache, row: Row, target: int | None = None, draft: int = 0) -> None:
    """The row's models have written its first ``target`` / ``draft`` tokens."""
    row.target_cached = row.seq_len - 1 if target is None else target
    row.draft_cached = draft
    cache.record(row)


PROMPT = list(range(10, 23))  # 13 tokens: 3 full blocks of 4, one partial


# ---- the pool -------------------------------------------------------------------------


def test_a_shared_block_is_freed_only_when_its_last_holder_leaves() -> None:
    pool = BlockPool(4, SIZE)
    first: list[int] = []
    pool.grow(first, 8)
    second: list[int] = []
    pool.share(second, first[:1])
    assert [pool.holders(b) for b in first] == [2, 1]
    assert pool.num_held == 2 and pool.num_free == 2
    pool.release(first)
    assert pool.holders(second[0]) == 1 and pool.num_free == 3
    pool.release(second)
    assert pool.num_free == 4 and pool.num_evictable == 0


def test_kept_blocks_become_evictable_count_as_free_and_are_evicted_tail_first() -> None:
    pool = BlockPool(4, SIZE)
    evicted: list[int] = []
    pool.on_evict = evicted.append
    table: list[int] = []
    pool.grow(table, 12)
    for block in table:
        pool.keep(block)
    blocks = list(table)
    pool.release(table)
    assert pool.num_evictable == 3 and pool.num_free == 4 and pool.num_held == 0
    fresh: list[int] = []
    pool.grow(fresh, 8)  # the one never-used block first, then the table's last block
    assert evicted == [blocks[2]] and pool.evictions == 1
    pool.grow(fresh, 12)
    assert evicted == [blocks[2], blocks[1]]
    with pytest.raises(OutOfBlocksError):
        pool.grow(fresh, 20)
    assert len(fresh) == 3 and pool.num_evictable == 1


def test_sharing_an_evictable_block_revives_it() -> None:
    pool = BlockPool(2, SIZE)
    table: list[int] = []
    pool.grow(table, 4)
    block = table[0]
    pool.keep(block)
    pool.release(table)
    assert pool.num_evictable == 1
    pool.share(table, [block])
    assert pool.num_evictable == 0 and pool.holders(block) == 1 and pool.num_free == 1


# ---- naming and hits ------------------------------------------------------------------


def test_a_block_is_named_by_its_tokens_and_everything_before_them() -> None:
    first = chain_digest(ROOT_DIGEST, [1, 2, 3, 4])
    assert chain_digest(ROOT_DIGEST, [1, 2, 3, 4]) == first
    assert chain_digest(first, [1, 2, 3, 4]) != first
    assert chain_digest(ROOT_DIGEST, [1, 2, 3, 5]) != first


def test_a_second_row_shares_the_full_blocks_and_computes_the_rest() -> None:
    cache = PrefixCache(BlockPool(16, SIZE))
    first = admitted(cache, PROMPT)
    computed(cache, first)
    second = make_row([*PROMPT[:11], 99, 98, 97])
    hit = cache.match(second)
    assert hit.blocks == tuple(first.blocks[:2])  # tokens 0..7; block 2 holds a different token
    assert hit.cached == {"target": 8, "draft": 0}
    cache.admit(second, hit)
    assert (second.target_cached, second.draft_cached) == (8, 0)
    assert [cache.pool.holders(b) for b in first.blocks] == [2, 2, 1, 1]
    stats = cache.stats()
    assert (stats.hit_tokens, stats.miss_tokens) == (8, 13 + 14 - 8)
    assert stats.cached_blocks == 3  # the first row's three full blocks


def test_a_hit_always_leaves_the_last_token_to_compute() -> None:
    cache = PrefixCache(BlockPool(16, SIZE))
    prompt = list(range(30, 42))  # 12 tokens: exactly 3 blocks
    first = admitted(cache, [*prompt, 7])
    computed(cache, first)
    again = make_row(prompt)
    # the third block would hold the pending last token: it is computed, not shared
    assert cache.match(again).cached["target"] == 8


def test_only_blocks_the_decoding_model_wrote_whole_are_named() -> None:
    cache = PrefixCache(BlockPool(16, SIZE))
    first = admitted(cache, PROMPT)
    computed(cache, first, target=6)  # one block whole, the second half written
    assert cache.match(make_row(PROMPT)).cached["target"] == 4
    computed(cache, first, target=12)
    assert cache.match(make_row(PROMPT)).cached["target"] == 12


def test_each_model_starts_at_its_own_cached_run() -> None:
    cache = PrefixCache(BlockPool(16, SIZE))
    first = admitted(cache, PROMPT)
    computed(cache, first, target=12, draft=5)
    assert cache.match(make_row(PROMPT)).cached == {"target": 12, "draft": 4}
    draft_only = make_row(PROMPT, mode="draft_only")
    # a row decoded by the draft shares only blocks holding the draft's KV
    assert cache.match(draft_only).blocks == tuple(first.blocks[:1])


def test_a_row_that_leaves_keeps_its_named_blocks_evictable_until_the_pool_needs_them() -> None:
    cache = PrefixCache(BlockPool(5, SIZE))
    first = admitted(cache, PROMPT)
    computed(cache, first)
    cache.release(first)
    assert cache.stats().evictable_blocks == 3 and cache.pool.num_free == 5
    assert cache.revived(cache.match(make_row(PROMPT))) == 3
    admitted(cache, list(range(50, 63)))  # 4 blocks: the 2 free ones, then 2 evicted
    stats = cache.stats()
    assert (stats.evictions, stats.cached_blocks, stats.evictable_blocks) == (2, 1, 1)
    assert cache.match(make_row(PROMPT)).cached["target"] == 4


def test_evictions_shorten_a_prefix_from_its_end() -> None:
    cache = PrefixCache(BlockPool(6, SIZE))
    first = admitted(cache, PROMPT)
    computed(cache, first)
    cache.release(first)
    admitted(cache, list(range(50, 61)))  # 3 blocks: the free ones
    hits = [cache.match(make_row(PROMPT)).cached["target"]]
    for start in (70, 80, 90):
        admitted(cache, [start])  # 1 block each, evicted from the evictable set
        hits.append(cache.match(make_row(PROMPT)).cached["target"])
    assert hits == [12, 8, 4, 0]
    assert cache.pool.evictions == 3


def test_a_copy_computed_beside_a_named_block_is_freed_not_kept() -> None:
    cache = PrefixCache(BlockPool(16, SIZE))
    first, twin = admitted(cache, PROMPT), admitted(cache, PROMPT)  # both missed
    computed(cache, first)
    computed(cache, twin)
    assert cache.stats().cached_blocks == 3
    cache.release(twin)
    assert cache.stats().evictable_blocks == 0 and cache.pool.num_held == 4
    cache.release(first)
    assert cache.stats().evictable_blocks == 3 and cache.pool.num_free == 16


def test_a_preempted_row_releases_its_hold_and_finds_its_blocks_again() -> None:
    cache = PrefixCache(BlockPool(16, SIZE))
    first = admitted(cache, PROMPT)
    computed(cache, first, draft=8)
    sharer = admitted(cache, [*PROMPT, 5, 6])
    shared = sharer.blocks[:3]
    assert (sharer.target_cached, sharer.draft_cached) == (12, 8)
    cache.release(sharer)  # preempted: its hold ends, the first row still holds the blocks
    assert [cache.pool.holders(b) for b in shared] == [1, 1, 1]
    assert sharer.blocks == [] and sharer.reported_blocks == {"target": 0, "draft": 0}
    again = cache.match(sharer)
    assert again.blocks == tuple(shared) and again.cached == {"target": 12, "draft": 8}
    cache.release(first)
    assert cache.pool.num_held == 0 and cache.stats().evictable_blocks == 3


# ---- the draft writing shared blocks --------------------------------------------------


def test_one_row_at_a_time_writes_the_draft_of_a_shared_block() -> None:
    cache = PrefixCache(BlockPool(16, SIZE))
    first = admitted(cache, PROMPT)
    computed(cache, first)
    second = admitted(cache, [*PROMPT, 1])
    assert cache.writable_end(first, "draft", 0, 6) == 6  # claims blocks 0 and 1
    assert cache.writable_end(second, "draft", 0, 12) == 0  # waits at block 0
    computed(cache, first, draft=6)  # block 0 written whole, block 1 half
    cache.skip_written(second, "draft")
    assert second.draft_cached == 4
    assert cache.writable_end(second, "draft", 4, 12) == 4  # block 1 is still the first row's
    cache.release(first)  # it left half way: its claim ends with it
    assert cache.writable_end(second, "draft", 4, 12) == 12


def test_a_block_written_for_the_draft_is_never_written_again() -> None:
    cache = PrefixCache(BlockPool(16, SIZE))
    first = admitted(cache, PROMPT)
    computed(cache, first, draft=4)
    late = admitted(cache, [*PROMPT, 1])
    late.draft_cached = 0
    # a row that would start inside a written block stops at it and skips it instead
    assert cache.writable_end(late, "draft", 0, 12) == 0
    cache.skip_written(late, "draft")
    assert late.draft_cached == 4


def test_switched_off_nothing_is_named_shared_or_kept() -> None:
    cache = PrefixCache(BlockPool(8, SIZE), enabled=False)
    first = admitted(cache, PROMPT)
    computed(cache, first)
    second = admitted(cache, PROMPT)
    assert second.target_cached == 0 and not set(first.blocks) & set(second.blocks)
    assert cache.writable_end(second, "draft", 0, 12) == 12
    cache.release(first)
    cache.release(second)
    assert cache.stats() == type(cache.stats())(hit_tokens=0, miss_tokens=26)
    assert cache.pool.num_evictable == 0 and cache.pool.num_free == 8


# ---- the most any placement can find ---------------------------------------------------


def test_reachable_hits_are_the_leading_blocks_an_earlier_request_left_named() -> None:
    system = list(range(100, 110))  # 10 tokens: 2 full blocks of 4
    turn_one = [*system, 1, 2]
    answer = [3, 4, 5, 6]
    turn_two = [*turn_one, *answer, 7, 8, 9]  # its history, the answer, a new user turn
    other = [*system, 50, 51, 52, 53, 54]
    served = [
        (turn_one, turn_one + answer),
        (turn_two, turn_two),
        (other, other),
        (list(range(200, 209)), list(range(200, 209))),
    ]
    # turn two finds turn one's blocks and the block the answer completed (16 of 19,
    # the last token always computed); the other prompt only the system's first two
    # blocks (its third differs); an unrelated prompt nothing; the first nothing
    assert reachable_hits(served, SIZE) == [0, 16, 8, 0]


def test_reachable_hits_match_a_cache_that_never_evicts() -> None:
    cache = PrefixCache(BlockPool(64, SIZE))
    prompts = [PROMPT, [*PROMPT, 1, 2, 3, 4], PROMPT[:9], [*PROMPT[:4], 99, *PROMPT[4:]], PROMPT]
    found = []
    for prompt in prompts:
        row = admitted(cache, prompt)
        found.append(row.target_cached)
        computed(cache, row)
        cache.release(row)
    assert reachable_hits([(p, p[:-1]) for p in prompts], SIZE) == found == [0, 12, 8, 4, 12]
